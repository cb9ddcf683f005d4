import sys

from otel_llm.cli import main

sys.exit(main())
