"""A trained run leaves the toolkit: batch scoring (:mod:`.predict`), export for serving
(:mod:`.export`) and the torch-free encoding of raw rows a server needs (:mod:`.encoding`)."""
