"""Placeholder until the HDF5 reader and writer land."""


def save(obj, checkpoint_file):
    raise NotImplementedError("cstorch.save is being written")


def load(checkpoint_file, map_location=None, **kwargs):
    raise NotImplementedError("cstorch.load is being written")
