"""exporter/store"""
