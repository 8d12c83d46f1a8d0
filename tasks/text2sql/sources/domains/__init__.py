"""The domains generated databases are made from, as data: one YAML file per domain, one format for both families
(the bundled databases and the synthesized ones), validated by `file_format.py` and read by `loader.py` into the
`schema.py` types that both generators fill and ask about."""
