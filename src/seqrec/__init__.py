"""seqrec: sequential recommendation (BERT4Rec, SASRec) reproduced honestly, fast on a CPU."""

from seqrec.config import (
    DataConfig,
    EvalConfig,
    RunConfig,
    TrainConfig,
    default_config,
    load_config,
)
from seqrec.data.io import read_interactions
from seqrec.data.prepare import prepare, prepare_frame
from seqrec.data.prepared import PreparedDataset, load_prepared
from seqrec.data.preprocess import Sequences, dataset_stats, preprocess
from seqrec.data.split import LeaveOneOut, leave_one_out
from seqrec.errors import ConfigError, DataError, DownloadError, SeqrecError
from seqrec.estimator import BERT4Rec, Model, SASRec, load
from seqrec.evaluation.metrics import paired_test, summarize
from seqrec.evaluation.protocols import PROTOCOLS, EvalReport, Scorer, compare_reports, evaluate
from seqrec.models.base import ModelEntry, SequenceModel
from seqrec.models.baselines import Popularity
from seqrec.models.bert4rec import BERT4RecConfig
from seqrec.models.gru4rec import GRU4Rec, GRU4RecConfig
from seqrec.models.sasrec import SASRecConfig
from seqrec.provenance import VERSION
from seqrec.serving.recommender import Recommender, UnknownItemsError
from seqrec.training.checkpoint import Run, load_run
from seqrec.training.fit import FitResult, fit
from seqrec.tuning import SearchResult, search

__version__ = VERSION

__all__ = [
    "BERT4Rec",
    "BERT4RecConfig",
    "PROTOCOLS",
    "ConfigError",
    "DataConfig",
    "DataError",
    "DownloadError",
    "EvalConfig",
    "EvalReport",
    "FitResult",
    "GRU4Rec",
    "GRU4RecConfig",
    "LeaveOneOut",
    "Model",
    "ModelEntry",
    "Popularity",
    "PreparedDataset",
    "Recommender",
    "Run",
    "RunConfig",
    "SASRec",
    "SASRecConfig",
    "Scorer",
    "SearchResult",
    "SeqrecError",
    "SequenceModel",
    "Sequences",
    "TrainConfig",
    "UnknownItemsError",
    "__version__",
    "compare_reports",
    "dataset_stats",
    "default_config",
    "evaluate",
    "fit",
    "leave_one_out",
    "load_config",
    "load_prepared",
    "load",
    "load_run",
    "paired_test",
    "prepare",
    "prepare_frame",
    "preprocess",
    "read_interactions",
    "search",
    "summarize",
]
