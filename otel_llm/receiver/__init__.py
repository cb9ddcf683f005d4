"""receiver"""
