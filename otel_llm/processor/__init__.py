"""processor"""
