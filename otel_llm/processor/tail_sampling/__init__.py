"""processor/tail_sampling"""
