"""``minigrad.module`` (imported as ``M``): the ``Module`` base class and the standard layers."""

from minigrad.module import graph, init
from minigrad.module.activation import (
    GELU,
    LeakyReLU,
    PReLU,
    ReLU,
    Sigmoid,
    SiLU,
    Softmax,
    Tanh,
)
from minigrad.module.attention import DotProductAttention, MultiHeadAttention
from minigrad.module.conv import (
    Conv1d,
    Conv2d,
    Conv3d,
    ConvTranspose2d,
    ConvTranspose3d,
    LocalConv2d,
)
from minigrad.module.dropout import Dropout
from minigrad.module.elementwise import Elemwise
from minigrad.module.embedding import Embedding
from minigrad.module.identity import Flatten, Identity
from minigrad.module.linear import Linear
from minigrad.module.loss import CrossEntropyLoss, MSELoss
from minigrad.module.module import HookHandler, Module, StateDictKeyError
from minigrad.module.normalization import (
    BatchNorm1d,
    BatchNorm2d,
    BatchNormBase,
    GroupNorm,
    InstanceNorm,
    LayerNorm,
    SyncBatchNorm,
)
from minigrad.module.pooling import AdaptiveAvgPool2d, AvgPool2d, MaxPool2d
from minigrad.module.rnn import LSTM, RNN, LSTMCell, RNNCell
from minigrad.module.sequential import Sequential
from minigrad.module.transformer import (
    MLP,
    SelfAttention,
    TransformerBlock,
    TransformerLayers,
    TransformerLM,
)

__all__ = [
    "GELU",
    "MLP",
    "AdaptiveAvgPool2d",
    "AvgPool2d",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNormBase",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "CrossEntropyLoss",
    "DotProductAttention",
    "Dropout",
    "Elemwise",
    "Embedding",
    "Flatten",
    "GroupNorm",
    "HookHandler",
    "Identity",
    "InstanceNorm",
    "LSTM",
    "LSTMCell",
    "LayerNorm",
    "LeakyReLU",
    "Linear",
    "LocalConv2d",
    "MSELoss",
    "MaxPool2d",
    "Module",
    "MultiHeadAttention",
    "PReLU",
    "RNN",
    "RNNCell",
    "ReLU",
    "SelfAttention",
    "Sequential",
    "SiLU",
    "SyncBatchNorm",
    "Sigmoid",
    "Softmax",
    "StateDictKeyError",
    "Tanh",
    "TransformerBlock",
    "TransformerLM",
    "TransformerLayers",
    "graph",
    "init",
]

