// Engine and routing scenarios (engine.libsonnet, shared with paired.jsonnet).
local e = import 'engine.libsonnet';
local t = import 'lib.libsonnet';

t.file(e.tests)
