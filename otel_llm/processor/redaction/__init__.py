"""processor/redaction"""
