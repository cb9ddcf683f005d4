"""processor/memory_limiter"""
