"""Extensions: components beside the pipelines (the Collector's ``extensions``), listed in
``service.extensions``."""
