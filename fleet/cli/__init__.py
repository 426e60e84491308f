"""fleet's command line: parse, call the library, print."""
