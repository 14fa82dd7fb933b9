"""The storage layer: the LMDB environment, the database registry grouped by area, key building
blocks and the stored-record codec. With the areas' schema modules, the only code that imports
``lmdb``."""
