"""exporters.debug"""
