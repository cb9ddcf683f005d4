"""exporters.otlp"""
