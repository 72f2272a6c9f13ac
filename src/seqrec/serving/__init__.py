"""Serving a trained run: the `Recommender` (external ids, top-k, exclusions), the HTTP service
(`service`, `routes`, `guard`, `batching`), every user's top-k to a file (`all_users`), and the
export to ONNX / TorchScript."""
