"""processor/llm_metrics/adapters"""
