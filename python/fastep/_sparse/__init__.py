"""Sparse EP machinery: the FITC/DTC problems, row-block algebra, the map-reduce (Dask) form and the choice of inducing inputs."""
