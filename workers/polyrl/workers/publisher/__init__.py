"""A frozen policy's publisher: the model into the Object Store, once (`publisher.main`)."""
