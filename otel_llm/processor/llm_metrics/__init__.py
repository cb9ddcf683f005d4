"""processor/llm_metrics"""
