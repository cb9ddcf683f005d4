"""exporter/exporterhelper"""
