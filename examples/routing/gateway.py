"""The KV-aware gateway of examples/routing/README.md: `kvoffload.integrations.dynamo_gateway`."""

from kvoffload.integrations.dynamo_gateway import main

if __name__ == "__main__":
    main()
