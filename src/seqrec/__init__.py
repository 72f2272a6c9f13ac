"""seqrec: sequential recommendation (BERT4Rec, SASRec) reproduced honestly, fast on a CPU."""

from seqrec.config import DataConfig, EvalConfig, RunConfig, load_config
from seqrec.data.io import read_interactions
from seqrec.data.prepared import PreparedDataset, load_prepared, prepare, prepare_frame
from seqrec.data.preprocess import Sequences, dataset_stats, preprocess
from seqrec.data.split import LeaveOneOut, leave_one_out
from seqrec.errors import ConfigError, DataError, DownloadError, SeqrecError
from seqrec.evaluate import PROTOCOLS, EvalReport, Scorer, evaluate
from seqrec.metrics import paired_test, summarize
from seqrec.models.baselines import Popularity

__version__ = "0.1.0"

__all__ = [
    "PROTOCOLS",
    "ConfigError",
    "DataConfig",
    "DataError",
    "DownloadError",
    "EvalConfig",
    "EvalReport",
    "LeaveOneOut",
    "Popularity",
    "PreparedDataset",
    "RunConfig",
    "Scorer",
    "SeqrecError",
    "Sequences",
    "__version__",
    "dataset_stats",
    "evaluate",
    "leave_one_out",
    "load_config",
    "load_prepared",
    "paired_test",
    "prepare",
    "prepare_frame",
    "preprocess",
    "read_interactions",
    "summarize",
]
