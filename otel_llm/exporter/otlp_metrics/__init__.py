"""exporter/otlp_metrics"""
