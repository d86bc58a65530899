"""The Relax ops ubitrain adds to TVM's for training, and their gradient rules: fused ops that
are one node in the graph and one kernel each way (BatchNorm, LayerNorm, softmax with
cross-entropy, embedding, take, adaptive pooling, ELU; fused_ops.py), the gradients TVM lacks
(gradients.py), and the tag that tells a legalized PrimFunc's op (tagging.py)."""
