"""pdata"""
