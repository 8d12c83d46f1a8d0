"""Generator of the bundled text-to-SQL data: seeded databases and question/SQL pairs over them."""
