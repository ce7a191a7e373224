"""The `specfleet` command line: one entry point, one module of subcommands per part."""
