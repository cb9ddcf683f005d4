"""internal"""
