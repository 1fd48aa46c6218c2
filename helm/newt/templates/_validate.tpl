{{/*
The rules between values that values.schema.json cannot express (JSON Schema cannot
compare two numbers or divide one by another). Each failure names the values involved.
The model's rules hold for newt's own trainer (no workers.command): a program has its own.
Included once, from configmap-spec.yaml, which is always rendered.
*/}}
{{- define "newt.validate" -}}
{{- $w := .Values.workers }}
{{- $p := .Values.spec.parallel }}
{{- $t := .Values.spec.train }}
{{- $tp := int $p.tp }}
{{- $pp := int $p.pp }}
{{- $group := mul $tp $pp }}
{{- if gt (int $w.minReplicas) (int $w.maxReplicas) }}
{{- fail (printf "newt: workers.minReplicas (%d) is above workers.maxReplicas (%d)" (int $w.minReplicas) (int $w.maxReplicas)) }}
{{- end }}
{{- if or (lt (int $w.replicas) (int $w.minReplicas)) (gt (int $w.replicas) (int $w.maxReplicas)) }}
{{- fail (printf "newt: workers.replicas (%d) is outside [workers.minReplicas, workers.maxReplicas] = [%d, %d]" (int $w.replicas) (int $w.minReplicas) (int $w.maxReplicas)) }}
{{- end }}
{{- $perPod := int (include "newt.workersPerPod" .) }}
{{- $per := include "newt.perPodName" . }}
{{- if and (gt (int $w.gpu.count) 0) (ne (int $w.perPod) 1) (ne (int $w.perPod) (int $w.gpu.count)) }}
{{- fail (printf "newt: workers.perPod (%d) with workers.gpu.count (%d): a GPU pod runs one worker per GPU under the node agent; leave workers.perPod at 1 (or set it to workers.gpu.count)" (int $w.perPod) (int $w.gpu.count)) }}
{{- end }}
{{- if ne (mod $perPod $tp) 0 }}
{{- fail (printf "newt: %s (%d) is not a multiple of spec.parallel.tp (%d): a tensor-parallel group must lie in one pod (one host)" $per $perPod $tp) }}
{{- end }}
{{- $minW := int (include "newt.minWorkers" .) }}
{{- $maxW := int (include "newt.maxWorkers" .) }}
{{- if lt $minW $group }}
{{- fail (printf "newt: workers.minReplicas x %s = %d workers cannot be laid out as tp x pp = %d x %d = %d" $per $minW $tp $pp $group) }}
{{- end }}
{{- if ne (mod $minW $group) 0 }}
{{- fail (printf "newt: workers.minReplicas x %s = %d workers cannot be laid out as whole tp x pp = %d x %d groups (%d would idle)" $per $minW $tp $pp (mod $minW $group)) }}
{{- end }}
{{- if ne (mod $maxW $group) 0 }}
{{- fail (printf "newt: workers.maxReplicas x %s = %d workers cannot be laid out as whole tp x pp = %d x %d groups (%d would idle)" $per $maxW $tp $pp (mod $maxW $group)) }}
{{- end }}
{{- /* the model: the preset's sizes (files/presets.json, model/config.c's; the schema's
enum names them), each replaced by its override (0: the preset's) -- the rules the
coordinators check at their start for newt's own trainer (gpt_start_check) */}}
{{- if and .Values.workers.restart (not .Values.workers.command) }}
{{- fail "newt: workers.restart supervises workers.command, a program that does not link newt: set workers.command" }}
{{- end }}
{{- if not .Values.workers.command }}
{{- $model := .Values.spec.model }}
{{- $preset := get (.Files.Get "files/presets.json" | fromJson) $model.preset }}
{{- $size := dict }}
{{- $from := dict }}
{{- range $f := list "vocab" "ctx" "layers" "heads" "channels" }}
{{- $over := int (default 0 (get $model $f)) }}
{{- $_ := set $size $f (ternary $over (int (get $preset $f)) (gt $over 0)) }}
{{- $_ = set $from $f (ternary "" (printf ", preset %s" $model.preset) (gt $over 0)) }}
{{- end }}
{{- if ne (mod $size.channels $size.heads) 0 }}
{{- fail (printf "newt: spec.model.heads (%d%s) does not divide spec.model.channels (%d%s)" $size.heads $from.heads $size.channels $from.channels) }}
{{- end }}
{{- if gt $pp $size.layers }}
{{- fail (printf "newt: spec.parallel.pp (%d) is more pipeline stages than spec.model.layers (%d%s)" $pp $size.layers $from.layers) }}
{{- end }}
{{- if ne (mod $size.heads $tp) 0 }}
{{- fail (printf "newt: spec.parallel.tp (%d) does not divide spec.model.heads (%d%s)" $tp $size.heads $from.heads) }}
{{- end }}
{{- if ne (mod $size.vocab $tp) 0 }}
{{- fail (printf "newt: spec.parallel.tp (%d) does not divide spec.model.vocab (%d%s): the embedding is split by tp" $tp $size.vocab $from.vocab) }}
{{- end }}
{{- $seq := int (default 0 $t.seq_len) }}
{{- if gt $seq $size.ctx }}
{{- fail (printf "newt: spec.train.seq_len (%d) is longer than spec.model.ctx (%d%s)" $seq $size.ctx $from.ctx) }}
{{- end }}
{{- end }}
{{- $gb := int $t.global_batch }}
{{- $mb := int $t.micro_batch }}
{{- if ne (mod $gb $mb) 0 }}
{{- fail (printf "newt: spec.train.global_batch (%d) is not a multiple of spec.train.micro_batch (%d)" $gb $mb) }}
{{- end }}
{{- $dpMin := int (include "newt.dpMin" .) }}
{{- $dpMax := int (include "newt.dpMax" .) }}
{{- if .Values.spec.parallel.even_batches }}
{{- $feasible := false }}
{{- range $dp := untilStep $dpMin (int (add1 (min $dpMax $gb))) 1 }}
{{- if eq (mod $gb (mul $dp $mb)) 0 }}{{ $feasible = true }}{{ end }}
{{- end }}
{{- if not $feasible }}
{{- fail (printf "newt: spec.train.global_batch (%d) cannot be split into micro-batches of %d over any data-parallel size in [%d, %d] (from workers.minReplicas/maxReplicas; spec.parallel.even_batches)" $gb $mb $dpMin $dpMax) }}
{{- end }}
{{- else if gt $dpMin $gb }}
{{- fail (printf "newt: spec.train.global_batch (%d) has too few samples for dp_min %d data-parallel ranks (from workers.minReplicas)" $gb $dpMin) }}
{{- end }}
{{- if gt (float64 $t.lr_min) (float64 $t.lr) }}
{{- fail (printf "newt: spec.train.lr_min (%v) is above spec.train.lr (%v)" $t.lr_min $t.lr) }}
{{- end }}
{{- if ge (int $w.terminationGracePeriodSeconds) (int $w.preemptionNoticeSeconds) }}
{{- fail (printf "newt: workers.terminationGracePeriodSeconds (%d) must be shorter than workers.preemptionNoticeSeconds (%d), the cloud's notice before it reclaims a node" (int $w.terminationGracePeriodSeconds) (int $w.preemptionNoticeSeconds)) }}
{{- end }}
{{- if .Values.etcdClient.tls.enabled }}
{{- range .Values.externalEtcd.endpoints }}
{{- if and (not $.Values.etcd.enabled) (not (hasPrefix "https://" .)) }}
{{- fail (printf "newt: externalEtcd.endpoints: %q is not https:// but etcdClient.tls.enabled is true" .) }}
{{- end }}
{{- end }}
{{- if and .Values.etcd.enabled (not .Values.etcdClient.tls.clientCert) }}
{{- fail "newt: etcdClient.tls.clientCert must be true with the in-chart etcd: it requires client certificates when TLS is on" }}
{{- end }}
{{- else }}
{{- range .Values.externalEtcd.endpoints }}
{{- if and (not $.Values.etcd.enabled) (hasPrefix "https://" .) }}
{{- fail (printf "newt: externalEtcd.endpoints: %q is https:// but etcdClient.tls.enabled is false (set it and etcdClient.tls.secret)" .) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and .Values.etcd.enabled .Values.etcdClient.auth.enabled .Values.etcdClient.auth.bootstrap.enabled (not .Values.etcdClient.auth.bootstrap.rootSecret) }}
{{- fail "newt: etcdClient.auth.bootstrap.rootSecret is needed to enable authentication on the in-chart etcd (or set etcdClient.auth.bootstrap.enabled: false and enable it yourself)" }}
{{- end }}
{{- if and .Values.chaos.enabled .Values.chaos.etcdKill.enabled (not .Values.etcd.enabled) }}
{{- fail "newt: chaos.etcdKill needs the in-chart etcd (etcd.enabled); disable it for an external etcd" }}
{{- end }}
{{- if and .Values.chaos.enabled .Values.chaos.etcdDelay.enabled (not .Values.etcd.enabled) }}
{{- fail "newt: chaos.etcdDelay needs the in-chart etcd (etcd.enabled); disable it for an external etcd" }}
{{- end }}
{{- end }}
