"""receiver/otlp"""
