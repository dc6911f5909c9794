// "Ray": logical GPUs Ray believes it has per Ray node, against what Kubernetes allocated
// to the pod and what its processes physically use; actors and placement groups by state.
local g = import '../lib/dashboards.libsonnet';

{
  grafanaDashboards+:: {
    local c = $._config,
    local ns = 'namespace=~"$namespace"',
    local wl = 'workload=~"$workload"',
    local S(m) = g.selector(c, m),
    local rayPods = 'gpuledger_ray_node_gpus%s' % S([ns, 'state="total"']),
    local legend = '{{namespace}}/{{pod}}',

    'gpuledger-ray.json': g.dashboard(
      c,
      'GPU Ledger / Ray',
      c.dashboardUids.ray,
      'Ray logical GPUs against Kubernetes allocation and physical use per Ray node; actors and placement groups by state.',
      [
        g.datasourceVariable,
        g.clusterVariable(c, 'gpuledger_build_info'),
        // Every namespace a workload is in (Ray GPU worker pods, actors, and the cluster-mode
        // placement groups and pending work), not only those with Ray nodes on GPU nodes: a
        // RayCluster whose placement groups are INFEASIBLE often has no GPU worker at all.
        g.queryVariable('namespace', 'Namespace', 'label_values(namespace_workload:gpuledger_workloads:group%s, namespace)' % g.selector(c, [], raw=false)),
        g.queryVariable('workload', 'Workload', 'label_values(namespace_workload:gpuledger_workloads:group%s, workload)' % g.selector(c, [ns], raw=false)),
      ],
      [
        {
          title: 'Logical vs physical GPUs per Ray node',
          height: 8,
          panels: [
            g.table(
              'Ray node ledger',
              'Per Ray node (a pod): GPUs Ray believes it has (logical, from num_gpus), GPUs Kubernetes allocated to the pod, and GPUs its processes physically use. Logical above allocated is double booking. Filtered by namespace only: Ray node series carry no workload.',
              'short',
              [
                g.target('max by (namespace, pod, pod_uid) (%s)' % rayPods),
                g.target('max by (namespace, pod, pod_uid) (gpuledger_ray_node_gpus%s)' % S([ns, 'state="allocated"'])),
                g.target('count by (namespace, pod, pod_uid) (max by (namespace, pod, pod_uid, gpu_uuid) (gpuledger_container_gpu_memory_used_bytes%s > 0) and on (pod_uid) %s)' % [S([ns]), rayPods]),
              ],
              [['namespace', 'Namespace'], ['pod', 'Pod'], ['Value #A', 'Ray logical GPUs'], ['Value #B', 'Kubernetes allocated'], ['Value #C', 'Physically used']],
            ),
          ],
        },
        {
          height: 8,
          panels: [
            g.timeseries(
              'Ray node GPUs: logical vs allocated',
              'Per Ray node: the logical GPUs Ray reports (total, available) and the GPUs Kubernetes allocated to its pod. total above allocated is double booking.',
              'short',
              [g.target('sum by (namespace, pod, state) (gpuledger_ray_node_gpus%s)' % S([ns]), legend + ' {{state}}')],
            ),
            g.timeseries(
              'Actors without GPU memory',
              'ALIVE actors with num_gpus > 0 whose process holds no GPU memory: Ray counts the GPU as used, the card does not.',
              'short',
              [g.target('sum by (namespace, workload, class_name) (gpuledger_ray_actors_without_gpu_memory%s)' % S([ns, wl]), '{{namespace}}/{{workload}} {{class_name}}')],
            ),
            g.timeseries(
              'GPU memory of Ray actors',
              'Physical GPU memory held by Ray actor processes (by NVML PID), per actor class and GPU.',
              'bytes',
              [g.target('sum by (namespace, pod, class_name, gpu_uuid) (gpuledger_ray_actor_gpu_memory_used_bytes%s)' % S([ns]), legend + ' {{class_name}} {{gpu_uuid}}')],
              stack=true,
            ),
          ],
        },
        {
          title: 'Actors and placement groups',
          height: 8,
          panels: [
            g.timeseries(
              'Actor GPUs by state',
              'Logical GPUs held or asked by Ray actors, by class and state (PENDING_CREATION waits for resources).',
              'short',
              [g.target('sum by (namespace, workload, class_name, state) (gpuledger_ray_actor_gpus%s)' % S([ns, wl]), '{{workload}} {{class_name}} {{state}}')],
            ),
            g.timeseries(
              'Placement groups by state',
              'Ray placement groups by state and scheduling state: NO_RESOURCES waits for busy resources, INFEASIBLE never fits.',
              'short',
              [g.target('sum by (workload, state, scheduling_state) (gpuledger_ray_placement_groups%s)' % S([ns, wl]), '{{workload}} {{state}} {{scheduling_state}}')],
            ),
            g.timeseries(
              'Ray GPUs pending',
              'GPUs asked by Ray work that is not placed, by kind.',
              'short',
              [g.target('sum by (namespace, workload, kind) (namespace_workload_kind:gpuledger_ray_pending_gpus:sum%s)' % g.selector(c, [ns, wl], raw=false), '{{workload}} {{kind}}')],
            ),
          ],
        },
      ],
    ),
  },
}
