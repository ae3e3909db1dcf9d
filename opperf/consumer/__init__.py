"""The consumer side of a database: msmodeling, the program the databases exist for — where its checkout and
Python are, the device it models, and running its own CLI unchanged."""
