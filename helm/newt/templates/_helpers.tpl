{{/*
Names, labels and the pieces every newt pod shares: the image, the etcd endpoints and the
client flags, volumes and mounts for etcd TLS and auth. The job spec is built here too.
*/}}

{{- define "newt.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name; StatefulSet pod names and Service names are built on it, so
it is cut to 40 characters to leave room for "-etcd-headless" and pod ordinals. */}}
{{- define "newt.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "newt.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "newt.selectorLabels" -}}
app.kubernetes.io/name: {{ include "newt.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "newt.labels" -}}
helm.sh/chart: {{ include "newt.chart" . }}
{{ include "newt.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: newt
{{- end }}

{{/* Labels of one component: (dict "ctx" $ "component" "worker"). */}}
{{- define "newt.componentLabels" -}}
{{ include "newt.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "newt.componentSelector" -}}
{{ include "newt.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "newt.etcdName" -}}{{ include "newt.fullname" . }}-etcd{{- end }}
{{- define "newt.etcdHeadless" -}}{{ include "newt.fullname" . }}-etcd-headless{{- end }}
{{- define "newt.coordinatorName" -}}{{ include "newt.fullname" . }}-coordinator{{- end }}
{{- define "newt.workersName" -}}{{ include "newt.fullname" . }}-workers{{- end }}
{{- define "newt.specName" -}}{{ include "newt.fullname" . }}-spec{{- end }}

{{/* The Secret holding the job secret: the user's, or the one this release makes; empty
when there is none. */}}
{{- define "newt.jobSecretName" -}}
{{- if .Values.jobSecret.secret }}{{ .Values.jobSecret.secret }}
{{- else if .Values.jobSecret.create }}{{ include "newt.fullname" . }}-job-secret
{{- end }}
{{- end }}

{{- define "newt.jobName" -}}
{{- default (include "newt.fullname" .) .Values.job.name }}
{{- end }}

{{- define "newt.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "newt.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* An image reference from {repository, tag, digest}; the second argument is the tag
used when tag is empty. */}}
{{- define "newt.imageRef" -}}
{{- $img := index . 0 }}
{{- if $img.digest }}
{{- printf "%s@%s" $img.repository $img.digest }}
{{- else }}
{{- printf "%s:%s" $img.repository (default (index . 1) $img.tag) }}
{{- end }}
{{- end }}

{{- define "newt.image" -}}
{{- include "newt.imageRef" (list .Values.image .Chart.AppVersion) }}
{{- end }}

{{/* The workers' image: workers.image, each empty field the chart's image's (the global
digest only when workers.image names nothing). */}}
{{- define "newt.workerImage" -}}
{{- $w := .Values.workers.image }}
{{- if or $w.repository $w.tag $w.digest }}
{{- $img := dict "repository" (default .Values.image.repository $w.repository) "tag" (default .Values.image.tag $w.tag) "digest" $w.digest }}
{{- include "newt.imageRef" (list $img .Chart.AppVersion) }}
{{- else }}
{{- include "newt.image" . }}
{{- end }}
{{- end }}

{{- define "newt.etcdImage" -}}
{{- include "newt.imageRef" (list .Values.etcd.image "v3.5.17") }}
{{- end }}

{{- define "newt.etcdScheme" -}}
{{- if .Values.etcdClient.tls.enabled }}https{{ else }}http{{ end }}
{{- end }}

{{/* The DNS name of etcd member i: (list $ i). */}}
{{- define "newt.etcdMemberHost" -}}
{{- $ := index . 0 }}
{{- printf "%s-%d.%s.%s.svc.%s" (include "newt.etcdName" $) (int (index . 1)) (include "newt.etcdHeadless" $) $.Release.Namespace $.Values.clusterDomain }}
{{- end }}

{{/* Comma-separated client endpoints: every in-chart member, or the external ones. */}}
{{- define "newt.etcdEndpoints" -}}
{{- if .Values.etcd.enabled }}
{{- $eps := list }}
{{- range $i := until (int .Values.etcd.replicas) }}
{{- $eps = append $eps (printf "%s://%s:%d" (include "newt.etcdScheme" $) (include "newt.etcdMemberHost" (list $ $i)) (int $.Values.etcd.clientPort)) }}
{{- end }}
{{- join "," $eps }}
{{- else }}
{{- join "," .Values.externalEtcd.endpoints }}
{{- end }}
{{- end }}

{{/* newt's etcd client flags (coordinator, worker, status), one YAML list item each. */}}
{{- define "newt.etcdClientArgs" -}}
- --job={{ include "newt.jobName" . }}
- --etcd={{ include "newt.etcdEndpoints" . }}
{{- if .Values.etcdClient.tls.enabled }}
- --etcd-ca=/etc/newt/etcd-tls/ca.crt
{{- if .Values.etcdClient.tls.clientCert }}
- --etcd-cert=/etc/newt/etcd-tls/tls.crt
- --etcd-key=/etc/newt/etcd-tls/tls.key
{{- end }}
{{- end }}
{{- if .Values.etcdClient.auth.enabled }}
- --etcd-password-file=/etc/newt/etcd-auth/password
{{- end }}
{{- end }}

{{/* The same connection as environment variables (the flags' fallbacks), so that
`kubectl exec ... -- newt status` works in any newt container; the etcd user comes from
the Secret this way. */}}
{{- define "newt.etcdClientEnv" -}}
- name: NEWT_JOB
  value: {{ include "newt.jobName" . | quote }}
- name: NEWT_ETCD
  value: {{ include "newt.etcdEndpoints" . | quote }}
{{- if .Values.etcdClient.tls.enabled }}
- name: NEWT_ETCD_CA
  value: /etc/newt/etcd-tls/ca.crt
{{- if .Values.etcdClient.tls.clientCert }}
- name: NEWT_ETCD_CERT
  value: /etc/newt/etcd-tls/tls.crt
- name: NEWT_ETCD_KEY
  value: /etc/newt/etcd-tls/tls.key
{{- end }}
{{- end }}
{{- if .Values.etcdClient.auth.enabled }}
- name: NEWT_ETCD_PASSWORD_FILE
  value: /etc/newt/etcd-auth/password
- name: NEWT_ETCD_USER
  valueFrom:
    secretKeyRef:
      name: {{ .Values.etcdClient.auth.secret }}
      key: {{ .Values.etcdClient.auth.usernameKey }}
{{- end }}
{{- end }}

{{- define "newt.etcdClientVolumeMounts" -}}
{{- if .Values.etcdClient.tls.enabled }}
- name: etcd-tls
  mountPath: /etc/newt/etcd-tls
  readOnly: true
{{- end }}
{{- if .Values.etcdClient.auth.enabled }}
- name: etcd-auth
  mountPath: /etc/newt/etcd-auth
  readOnly: true
{{- end }}
{{- end }}

{{- define "newt.etcdClientVolumes" -}}
{{- if .Values.etcdClient.tls.enabled }}
- name: etcd-tls
  secret:
    secretName: {{ .Values.etcdClient.tls.secret }}
    defaultMode: 0440
{{- end }}
{{- if .Values.etcdClient.auth.enabled }}
- name: etcd-auth
  secret:
    secretName: {{ .Values.etcdClient.auth.secret }}
    defaultMode: 0440
    items:
      - key: {{ .Values.etcdClient.auth.passwordKey }}
        path: password
{{- end }}
{{- end }}

{{/* etcdctl's environment for the test hook and the auth bootstrap (ETCDCTL_*). */}}
{{- define "newt.etcdctlEnv" -}}
- name: ETCDCTL_API
  value: "3"
- name: ETCDCTL_ENDPOINTS
  value: {{ include "newt.etcdEndpoints" . | quote }}
{{- if .Values.etcdClient.tls.enabled }}
- name: ETCDCTL_CACERT
  value: /etc/newt/etcd-tls/ca.crt
{{- if .Values.etcdClient.tls.clientCert }}
- name: ETCDCTL_CERT
  value: /etc/newt/etcd-tls/tls.crt
- name: ETCDCTL_KEY
  value: /etc/newt/etcd-tls/tls.key
{{- end }}
{{- end }}
{{- end }}

{{- define "newt.podSecurityContext" -}}
{{- toYaml .Values.podSecurityContext }}
{{- end }}

{{- define "newt.containerSecurityContext" -}}
{{- toYaml .Values.containerSecurityContext }}
{{- end }}

{{- define "newt.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* newt workers in one pod: one per GPU in GPU mode (workers.gpu.count > 0: one container
runs the node agent, `newt worker --local-workers`), else workers.perPod (one container each). */}}
{{- define "newt.workersPerPod" -}}
{{- if gt (int .Values.workers.gpu.count) 0 }}{{ int .Values.workers.gpu.count }}{{ else }}{{ int .Values.workers.perPod }}{{ end }}
{{- end }}
{{/* Worker containers in one pod: 1 in GPU mode, else workers.perPod. */}}
{{- define "newt.workerContainers" -}}
{{- if gt (int .Values.workers.gpu.count) 0 }}1{{ else }}{{ int .Values.workers.perPod }}{{ end }}
{{- end }}
{{/* The value that sets the workers per pod, for messages. */}}
{{- define "newt.perPodName" -}}
{{- if gt (int .Values.workers.gpu.count) 0 }}workers.gpu.count{{ else }}workers.perPod{{ end }}
{{- end }}

{{/* Workers at the low and high ends of the elastic range. */}}
{{- define "newt.minWorkers" -}}
{{- mul (int .Values.workers.minReplicas) (int (include "newt.workersPerPod" .)) }}
{{- end }}
{{- define "newt.maxWorkers" -}}
{{- mul (int .Values.workers.maxReplicas) (int (include "newt.workersPerPod" .)) }}
{{- end }}

{{/* The spec's data-parallel range from the worker bounds. */}}
{{- define "newt.dpMin" -}}
{{- div (int (include "newt.minWorkers" .)) (mul (int .Values.spec.parallel.tp) (int .Values.spec.parallel.pp)) }}
{{- end }}
{{- define "newt.dpMax" -}}
{{- div (int (include "newt.maxWorkers" .)) (mul (int .Values.spec.parallel.tp) (int .Values.spec.parallel.pp)) }}
{{- end }}

{{- define "newt.backend" -}}
{{- if .Values.spec.backend }}{{ .Values.spec.backend }}{{ else if gt (int .Values.workers.gpu.count) 0 }}nccl{{ else }}cpu{{ end }}
{{- end }}

{{/* The job spec document given to the coordinators (coordinator/spec.h). */}}
{{- define "newt.specJson" -}}
{{- $s := deepCopy .Values.spec }}
{{- $_ := set $s "job" (include "newt.jobName" .) }}
{{- $_ = set $s "backend" (include "newt.backend" .) }}
{{- $_ = set $s.parallel "dp_min" (int (include "newt.dpMin" .)) }}
{{- $_ = set $s.parallel "dp_max" (int (include "newt.dpMax" .)) }}
{{- $_ = set $s.ckpt "dir" (ternary .Values.checkpoints.mountPath "" .Values.checkpoints.enabled) }}
{{- if .Values.workers.restart }}
{{- /* the restart mode (job/spec.h spec_set_restart): the steps are the supervisors' beats, and
the program keeps its own checkpoints (the volume is still mounted for it) */}}
{{- $_ = set $s "restart" true }}
{{- $_ = set $s.train "steps" 1099511627776 }}
{{- $_ = set $s.train "global_batch" 1024 }}
{{- $_ = set $s.train "micro_batch" 1 }}
{{- $_ = set $s.ckpt "dir" "" }}
{{- $_ = set $s.ckpt "every" 0 }}
{{- end }}
{{- toPrettyJson $s }}
{{- end }}

{{/* How the Jobs of coordinators and workers end (docs/kubernetes.md): newt's exit statuses
(job/records.h) against the pod failure policy, the budget of crashes, the clean-up. */}}
{{/* A Prometheus duration ("15s", "1m30s", "500ms"; values.schema.json checks the form) in
whole milliseconds. */}}
{{- define "newt.durationMs" -}}
{{- $units := dict "ns" 0.000001 "us" 0.001 "µs" 0.001 "ms" 1.0 "s" 1000.0 "m" 60000.0 "h" 3600000.0 }}
{{- $ms := 0.0 }}
{{- range regexFindAll "[0-9.]+[a-zµ]+" . -1 }}
{{- $n := regexFind "^[0-9.]+" . }}
{{- $ms = addf $ms (mulf (float64 $n) (get $units (trimPrefix $n .))) }}
{{- end }}
{{- $ms | int }}
{{- end }}

{{- define "newt.jobEnd" -}}
backoffLimit: {{ .Values.jobPolicy.backoffLimit }}
{{- with .Values.jobPolicy.activeDeadlineSeconds }}
activeDeadlineSeconds: {{ . }}
{{- end }}
{{- if ge (int .Values.cleanup.ttlSecondsAfterFinished) 0 }}
ttlSecondsAfterFinished: {{ .Values.cleanup.ttlSecondsAfterFinished }}
{{- end }}
podFailurePolicy:
  rules:
    # 3: left on SIGTERM (preemption, drain, scale-down): replaced, not a failure;
    # 5: a worker left out (stopped, cut off) that the job, done without it, did not take back
    - action: Ignore
      onExitCodes:
        operator: In
        values: [3, 5]
    # evicted, preempted, its node shut down: replaced, not a failure
    - action: Ignore
      onPodConditions:
        - type: DisruptionTarget
          status: "True"
    # 4: the job failed (failure budget spent); 2: a bad flag or spec: no retry helps
    - action: FailJob
      onExitCodes:
        operator: In
        values: [2, 4]
{{- end }}

{{/* The checkpoint volume (checkpoints.enabled): the chart's claim, yours, or a hostPath. */}}
{{- define "newt.checkpointsVolume" -}}
{{- $ck := .Values.checkpoints -}}
- name: checkpoints
  {{- if eq $ck.type "hostPath" }}
  hostPath:
    path: {{ $ck.hostPath.path }}
    type: {{ $ck.hostPath.type }}
  {{- else }}
  persistentVolumeClaim:
    claimName: {{ ternary $ck.existingClaim (printf "%s-checkpoints" (include "newt.fullname" .)) (eq $ck.type "existingClaim") }}
  {{- end }}
{{- end }}

{{/* The run's files on the checkpoint volume, for `newt report DIR`: the workers' step log
     (steps.jsonl) and the leader's event log (events.jsonl). */}}
{{- define "newt.runDir" -}}
{{- printf "%s/runs/%s" .Values.checkpoints.mountPath (include "newt.jobName" .) }}
{{- end }}
