"""exporter"""
