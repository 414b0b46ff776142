"""What runs read: the dataset schema, the feature map, the identities of prepared data and
the batch loader (preparing data is :mod:`ctrcal.preparation`)."""
