// "GPU ledger": per node and GPU UUID, who is allocated which GPU, who uses it, how much
// memory each pod holds on shared GPUs, and where allocation and use disagree. A MIG device
// is a row of its own (gpu_uuid: its MIG UUID) showing its GPU (parent_gpu_uuid).
local g = import '../lib/dashboards.libsonnet';

{
  grafanaDashboards+:: {
    local c = $._config,
    local node = 'node=~"$node"',
    local gpu = 'gpu_uuid=~"$gpu"',
    local ns = 'namespace=~"$namespace"',
    local S(m) = g.selector(c, m),
    local podKey = 'node, parent_gpu_uuid, gpu_uuid, namespace, pod, container',
    // The MIG devices of the selected GPUs.
    local migsOf = ['parent_gpu_uuid=~"$gpu"', 'parent_gpu_uuid!=""'],
    local migKey = 'node, parent_gpu_uuid, gpu_uuid',
    // Allocations through a device plugin: those no DRA ResourceClaim made (every DRA
    // allocation is also a gpuledger_gpu_allocation_info, its resource the driver).
    local pluginAllocations(m) = '(gpuledger_gpu_allocation_info%s unless on (%s, node, gpu_uuid, pod_uid, container) gpuledger_dra_allocation_info%s)'
                                 % [S(m), c.clusterLabel, S(m)],
    local claimKey = 'dra_claim_namespace, dra_claim_name, dra_driver_name, dra_pool_name, dra_device_name, dra_share_id',

    'gpuledger-gpu-ledger.json': g.dashboard(
      c,
      'GPU Ledger / GPUs',
      c.dashboardUids.ledger,
      'Per node and GPU UUID: allocated to and used by which pod and container (through a device plugin or a DRA ResourceClaim), memory by pod on shared GPUs, allocated-unused and unallocated use, container device ordinals.',
      [
        g.datasourceVariable,
        g.clusterVariable(c, 'gpuledger_gpu_info'),
        g.queryVariable('node', 'Node', 'label_values(gpuledger_gpu_info%s, node)' % S([])),
        g.queryVariable('gpu', 'GPU UUID', 'label_values(gpuledger_gpu_info%s, gpu_uuid)' % S([node])),
        g.queryVariable('namespace', 'Namespace', 'label_values(gpuledger_container_device_info%s, namespace)' % S([node])),
      ],
      [
        {
          title: 'GPUs',
          height: 7,
          panels: [
            g.table(
              'GPU inventory',
              'Every GPU gpuledger sees (NVML), by UUID. The host index is only an attribute: it differs between host, container and process.',
              'short',
              [g.target('max by (node, gpu_uuid, gpu_index, model, pci_bus_id, mig_mode) (gpuledger_gpu_info%s)' % S([node, gpu]))],
              [['node', 'Node'], ['gpu_index', 'Index'], ['gpu_uuid', 'GPU UUID'], ['model', 'Model'], ['pci_bus_id', 'PCI bus'], ['mig_mode', 'MIG']],
            ),
            g.table(
              'MIG devices under each GPU',
              "The MIG devices of each GPU in MIG mode, sorted by their GPU: MIG device index (the toolkit's <gpu>:<mig>), profile, GPU and compute instance ids (nvidia-smi's GI and CI), memory. Each is allocated, used and alerted on by its own MIG UUID.",
              'short',
              [
                g.target('max by (%s, mig_index, profile, gpu_instance_id, compute_instance_id) (gpuledger_mig_device_info%s)' % [migKey, S([node] + migsOf)]),
                g.target('max by (%s) (gpuledger_gpu_memory_used_bytes%s)' % [migKey, S([node] + migsOf)]),
                g.target('max by (%s) (gpuledger_gpu_memory_total_bytes%s)' % [migKey, S([node] + migsOf)]),
              ],
              [
                ['node', 'Node'],
                ['parent_gpu_uuid', 'GPU UUID'],
                ['mig_index', 'MIG'],
                ['gpu_uuid', 'MIG device UUID'],
                ['profile', 'Profile'],
                ['gpu_instance_id', 'GI'],
                ['compute_instance_id', 'CI'],
                ['Value #B', 'Memory used'],
                ['Value #C', 'Memory total'],
              ],
              { 'Value #B': 'bytes', 'Value #C': 'bytes' },
            ) + { options+: { sortBy: [{ displayName: 'GPU UUID', desc: false }] } },
          ],
        },
        {
          height: 8,
          panels: [
            g.timeseries(
              'GPU memory used',
              "Device memory in use per GPU (NVML), and per MIG device (with its GPU); a GPU in MIG mode holds its MIG devices' memory.",
              'bytes',
              [g.target('max by (node, gpu_uuid, parent_gpu_uuid) (gpuledger_gpu_memory_used_bytes%s)' % S([node, gpu]), '{{node}} {{gpu_uuid}} {{parent_gpu_uuid}}')],
            ),
            g.timeseries(
              'GPU memory total',
              'Device memory size per GPU (NVML).',
              'bytes',
              [g.target('max by (node, gpu_uuid) (gpuledger_gpu_memory_total_bytes%s)' % S([node, gpu]), '{{node}} {{gpu_uuid}}')],
            ),
            g.timeseries(
              'GPU utilization',
              'Fraction of time a kernel ran (NVML). Absent on MIG-enabled GPUs.',
              'percentunit',
              [g.target('max by (node, gpu_uuid) (gpuledger_gpu_utilization_ratio%s)' % S([node, gpu]), '{{node}} {{gpu_uuid}}')],
              max=1,
            ),
            g.timeseries(
              'GPUs answering NVML',
              'GPUs whose NVML queries succeed (1) or fail, e.g. GPU_IS_LOST (0); MIG devices are not counted.',
              'short',
              [g.target('sum by (node) (gpuledger_gpu_up%s)' % S([node, gpu, 'parent_gpu_uuid=""']), '{{node}}')],
            ),
          ],
        },
        {
          title: 'Allocation vs use',
          height: 9,
          panels: [
            g.table(
              'Allocated to / used by, per container',
              'One row per GPU (or MIG device, with its GPU) and container: Kubernetes allocation (PodResources), GPU memory its processes hold (NVML), and the two disagreements. A GPU used by a container it is not allocated to, or allocated and never opened, shows here.',
              'short',
              [
                g.target('max by (%s) (gpuledger_gpu_allocation_info%s)' % [podKey, S([node, gpu, ns])]),
                g.target('sum by (%s) (gpuledger_container_gpu_memory_used_bytes%s)' % [podKey, S([node, gpu, ns])]),
                g.target('max by (%s) (gpuledger_gpu_allocated_unused%s)' % [podKey, S([node, gpu, ns])]),
                g.target('max by (%s) (gpuledger_gpu_unallocated_use%s)' % [podKey, S([node, gpu, ns])]),
              ],
              [
                ['node', 'Node'],
                ['gpu_uuid', 'GPU or MIG UUID'],
                ['parent_gpu_uuid', 'GPU of the MIG device'],
                ['namespace', 'Namespace'],
                ['pod', 'Pod'],
                ['container', 'Container'],
                ['Value #A', 'Allocated'],
                ['Value #B', 'Memory used'],
                ['Value #C', 'Allocated, unused'],
                ['Value #D', 'Used, not allocated'],
              ],
              { 'Value #B': 'bytes' },
            ),
          ],
        },
        {
          // Device plugin and DRA side by side: the same allocations as the table above,
          // apart by how Kubernetes made them.
          height: 8,
          panels: [
            g.table(
              'Allocated through a device plugin',
              'GPUs and MIG devices the kubelet gave a container through a device plugin (an extended resource such as nvidia.com/gpu in the pod spec): PodResources devices.',
              'short',
              [g.target('max by (%s, resource) %s' % [podKey, pluginAllocations([node, gpu, ns])])],
              [
                ['node', 'Node'],
                ['gpu_uuid', 'GPU or MIG UUID'],
                ['parent_gpu_uuid', 'GPU of the MIG device'],
                ['namespace', 'Namespace'],
                ['pod', 'Pod'],
                ['container', 'Container'],
                ['resource', 'Resource'],
              ],
            ) + g.width({}, 9),
            g.table(
              'Allocated through DRA ResourceClaims',
              "GPUs and MIG devices the kubelet gave a container through a Kubernetes DRA ResourceClaim (PodResources dynamic_resources), resolved to their UUID through the node's ResourceSlices: the claim, the driver's pool and device name, and the share when several claims hold one device.",
              'short',
              [g.target('max by (%s, %s) (gpuledger_dra_allocation_info%s)' % [podKey, claimKey, S([node, gpu, ns])])],
              [
                ['node', 'Node'],
                ['gpu_uuid', 'GPU or MIG UUID'],
                ['parent_gpu_uuid', 'GPU of the MIG device'],
                ['namespace', 'Namespace'],
                ['pod', 'Pod'],
                ['container', 'Container'],
                ['dra_claim_namespace', 'Claim namespace'],
                ['dra_claim_name', 'Claim'],
                ['dra_driver_name', 'Driver'],
                ['dra_pool_name', 'Pool'],
                ['dra_device_name', 'Device'],
                ['dra_share_id', 'Share'],
              ],
            ) + g.width({}, 9),
            g.timeseries(
              'Allocations: device plugin vs DRA',
              'Container-GPU allocations per node, by how Kubernetes made them: a device plugin, or a DRA ResourceClaim.',
              'short',
              [
                g.target('count by (node) %s' % pluginAllocations([node, gpu, ns]), '{{node}} device plugin'),
                g.target('count by (node) (gpuledger_dra_allocation_info%s)' % S([node, gpu, ns]), '{{node}} DRA'),
              ],
            ),
          ],
        },
        {
          height: 8,
          panels: [
            g.stat(
              'GPUs allocated but unused',
              'Container-GPU pairs Kubernetes allocated that no process of the container uses (a MIG device counts as one GPU).',
              'short',
              [g.target('sum(gpuledger_gpu_allocated_unused%s) or vector(0)' % S([node, gpu, ns]))],
              [{ color: 'green', value: null }, { color: 'orange', value: 1 }],
            ) + g.width({}, 4),
            g.stat(
              'GPUs used without allocation',
              'Container-GPU pairs where a container uses a GPU Kubernetes did not allocate to it.',
              'short',
              [g.target('sum(gpuledger_gpu_unallocated_use%s) or vector(0)' % S([node, gpu, ns]))],
              [{ color: 'green', value: null }, { color: 'red', value: 1 }],
            ) + g.width({}, 4),
            g.timeseries(
              'Allocation disagreements over time',
              'Allocated-unused and unallocated-use pairs per pod.',
              'short',
              [
                g.target('sum by (namespace, pod) (gpuledger_gpu_allocated_unused%s)' % S([node, gpu, ns]), 'allocated, unused {{namespace}}/{{pod}}'),
                g.target('sum by (namespace, pod) (gpuledger_gpu_unallocated_use%s)' % S([node, gpu, ns]), 'used, not allocated {{namespace}}/{{pod}}'),
              ],
            ),
          ],
        },
        {
          title: 'Memory by pod on each GPU',
          height: 9,
          panels: [
            g.timeseries(
              'GPU memory by pod',
              'Memory the processes of each pod hold on each GPU, stacked, plus processes that are in no pod: on a shared (time-sliced) GPU, who holds what.',
              'bytes',
              [
                g.target('sum by (gpu_uuid, namespace, pod) (gpuledger_container_gpu_memory_used_bytes%s)' % S([node, gpu, ns]), '{{gpu_uuid}} {{namespace}}/{{pod}}'),
                g.target('sum by (gpu_uuid) (gpuledger_unattributed_gpu_memory_used_bytes%s)' % S([node, gpu]), '{{gpu_uuid}} host processes'),
              ],
              stack=true,
            ),
            g.timeseries(
              'Processes per GPU and container',
              'Processes of each container that hold a CUDA context on each GPU.',
              'short',
              [g.target('sum by (gpu_uuid, namespace, pod, container) (gpuledger_container_gpu_processes%s)' % S([node, gpu, ns]), '{{gpu_uuid}} {{namespace}}/{{pod}}/{{container}}')],
            ),
          ],
        },
        {
          title: 'Device mapping',
          height: 8,
          panels: [
            g.table(
              'Container ordinal to host GPU',
              "What CUDA calls device N inside a container (before the process's own CUDA_VISIBLE_DEVICES) is which host GPU.",
              'short',
              [g.target('max by (node, namespace, pod, container, local_index, gpu_uuid, source) (gpuledger_container_device_info%s)' % S([node, gpu, ns]))],
              [['node', 'Node'], ['namespace', 'Namespace'], ['pod', 'Pod'], ['container', 'Container'], ['local_index', 'Ordinal'], ['gpu_uuid', 'Host GPU UUID'], ['source', 'From']],
            ),
            g.table(
              'Engine processes to GPUs',
              'Which GPUs the processes of each vLLM engine (scrape target and data-parallel rank) hold (engine core and workers, by rank).',
              'short',
              [g.target('max by (node, namespace, pod, target, engine, role, rank, gpu_uuid) (gpuledger_engine_gpu_info%s)' % S([node, gpu, ns]))],
              [['node', 'Node'], ['namespace', 'Namespace'], ['pod', 'Pod'], ['target', 'Target'], ['engine', 'Engine'], ['role', 'Role'], ['rank', 'Rank'], ['gpu_uuid', 'GPU UUID']],
            ),
            g.table(
              'GPUs allocated per pod',
              'Distinct GPUs Kubernetes allocated to each pod, all containers together.',
              'short',
              [g.target('max by (node, namespace, pod) (node_namespace_pod:gpuledger_gpu_allocation_info:count%s)' % g.selector(c, [node, ns], raw=false))],
              [['node', 'Node'], ['namespace', 'Namespace'], ['pod', 'Pod'], ['Value', 'GPUs']],
            ),
          ],
        },
        {
          // The state set gpuledger_source_state as one number per source: [value, color].
          local sourceStates = { up: [1, 'green'], down: [0, 'red'], not_configured: [2, '#8e8e8e'] },
          local sourceKey = 'job, node, source',
          local sourceState = |||
            max by (%(k)s) (gpuledger_source_state%(up)s)
            + %(nc)d * max by (%(k)s) (gpuledger_source_state%(notConfigured)s)
            or
            max by (%(k)s) (gpuledger_source_up%(all)s)
          ||| % {
            k: sourceKey,
            up: S([node, 'state="up"']),
            nc: sourceStates.not_configured[0],
            notConfigured: S([node, 'state="not_configured"']),
            all: S([node]),
          },
          title: 'Exporter sources',
          height: 7,
          panels: [
            g.stat(
              'Sources down',
              'Sources that are configured and whose last fetch failed (gpuledger_source_state{state="down"}): their series are missing, GpuLedgerSourceDown fires after %s, and the ledger alerts of a node where a source matching %s is down stay silent.' % [c.sourceDownFor, c.ledgerSourcesRegex],
              'short',
              [g.target('sum(gpuledger_source_state%s)' % S([node, 'state="down"']))],
              [{ color: 'green', value: null }, { color: 'red', value: 1 }],
            ) + g.width({}, 4),
            g.stat(
              'Sources not configured',
              'Sources this exporter is not set up to read (no vLLM targets, no Ray address, no Kubernetes; gpuledger_source_state{state="not_configured"}). Not a failure: nothing alerts on them.',
              'short',
              [g.target('sum(gpuledger_source_state%s)' % S([node, 'state="not_configured"']))],
              [{ color: sourceStates.not_configured[1], value: null }],
            ) + g.width({}, 4),
            g.stateTimeline(
              'Source state',
              'Each source of each exporter: up, down (configured, its last fetch failed: red) or not configured (grey), from the state set gpuledger_source_state. Exporters without it show gpuledger_source_up: up or down.',
              [g.target(sourceState, '{{node}} {{source}} ({{job}})')],
              [[sourceStates[s][0], std.strReplace(s, '_', ' '), sourceStates[s][1]] for s in ['up', 'down', 'not_configured']],
            ),
          ],
        },
      ],
    ),
  },
}
