"""The SQL machinery: untrusted SQL screened, run in a capped sandbox and its worker processes, and results matched."""
