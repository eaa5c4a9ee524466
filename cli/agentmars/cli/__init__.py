"""The ``agentmars`` command. Sub-commands import their part lazily so that
``agentmars --help`` and light commands never load web frameworks or clients."""
