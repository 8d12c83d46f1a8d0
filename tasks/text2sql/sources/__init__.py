"""The data sources: the bundled, Spider/BIRD and synthesized examples, each labelled with its difficulty."""
