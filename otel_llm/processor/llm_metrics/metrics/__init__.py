"""processor/llm_metrics/metrics"""
