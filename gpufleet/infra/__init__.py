"""The Pulumi program's components: a StackSpec realised on a Kubernetes cluster.

`infra/__main__.py` is the entry point under the Pulumi CLI; `gpufleet.infra.offline` runs the same
program under Pulumi's mock runtime (offline preview, unit tests, benchmark).
"""

from gpufleet.infra.charts import CHARTS, ChartRef
from gpufleet.infra.fabric import Fabric, FabricArgs
from gpufleet.infra.gameday import GamedayArgs, GamedaySchedule
from gpufleet.infra.gpu_software import GpuSoftware, GpuSoftwareArgs
from gpufleet.infra.monitoring import Monitoring, MonitoringArgs
from gpufleet.infra.nodepools import GpuNodePool, GpuNodePoolArgs
from gpufleet.infra.platform import Platform, PlatformArgs, stack_outputs
from gpufleet.infra.scheduler import Scheduler, SchedulerArgs
from gpufleet.infra.self_healing import SelfHealing, SelfHealingArgs
from gpufleet.infra.storage import Storage, StorageArgs

__all__ = [
    "CHARTS",
    "ChartRef",
    "Fabric",
    "FabricArgs",
    "GamedayArgs",
    "GamedaySchedule",
    "GpuNodePool",
    "GpuNodePoolArgs",
    "GpuSoftware",
    "GpuSoftwareArgs",
    "Monitoring",
    "MonitoringArgs",
    "Platform",
    "PlatformArgs",
    "Scheduler",
    "SchedulerArgs",
    "SelfHealing",
    "SelfHealingArgs",
    "Storage",
    "StorageArgs",
    "stack_outputs",
]
