# Cython package marker: lets downstream code cimport fastep._epcore.sites.
