// Every dashboard of the mixin, as grafanaDashboards['<file>.json'].
(import 'waiting.libsonnet') +
(import 'ledger.libsonnet') +
(import 'engines.libsonnet') +
(import 'ray.libsonnet')
