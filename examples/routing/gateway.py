"""The KV-aware gateway of examples/routing/README.md: `kvoffload.integrations.gateway_cli`."""

from kvoffload.integrations.gateway_cli import main

if __name__ == "__main__":
    main()
