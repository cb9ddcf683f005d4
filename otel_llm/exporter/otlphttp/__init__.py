"""exporters.otlphttp"""
