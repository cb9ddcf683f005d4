"""exporter/prometheus"""
