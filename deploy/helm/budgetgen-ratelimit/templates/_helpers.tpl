{{/* Name of every object (the Service's name is what the spec's rateLimitService.name names). */}}
{{- define "rls.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "rls.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: ratelimit
{{- end -}}

{{- define "rls.labels" -}}
{{ include "rls.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "rls.serverSecret" -}}
{{- .Values.tls.serverSecretName | default (printf "%s-tls" (include "rls.fullname" .)) -}}
{{- end -}}

{{- define "rls.clientSecret" -}}
{{- printf "%s-agentgateway-client" (include "rls.fullname" .) -}}
{{- end -}}

{{- /* "true" when valkey.caCert names a Secret or a ConfigMap (REDIS_TLS_CACERT). */ -}}
{{- define "rls.valkeyCA" -}}
{{- with .Values.valkey.caCert -}}
{{- if or .secretName .configMapName -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{- define "rls.validate" -}}
{{- with .Values.valkey.caCert -}}
{{- if and .secretName .configMapName -}}
{{- fail "valkey.caCert: set secretName or configMapName, not both" -}}
{{- end -}}
{{- end -}}
{{- if and (include "rls.valkeyCA" .) (not .Values.valkey.tls) -}}
{{- fail "valkey.caCert is set but valkey.tls is false: the CA verifies Valkey's certificate over TLS only; set valkey.tls=true" -}}
{{- end -}}
{{- if and .Values.valkey.sentinelAuthKey (ne .Values.valkey.type "sentinel") -}}
{{- fail (printf "valkey.sentinelAuthKey is set but valkey.type is %s: it is the sentinels' password (REDIS_SENTINEL_AUTH_FILE); set valkey.type=sentinel or leave it empty" .Values.valkey.type) -}}
{{- end -}}
{{- if and .Values.valkey.clientCert.secretName (not .Values.valkey.tls) -}}
{{- fail "valkey.clientCert is set but valkey.tls is false: a client certificate is presented over TLS only; set valkey.tls=true" -}}
{{- end -}}
{{- if not (has .Values.tls.mode (list "mutual" "server" "disabled")) -}}
{{- fail (printf "tls.mode must be mutual, server or disabled, got %q" .Values.tls.mode) -}}
{{- end -}}
{{- if and (not .Values.embedded.enabled) (not .Values.valkey.secretName) -}}
{{- fail "valkey.secretName is required: the Secret holding Valkey's address (key valkey.urlKey)" -}}
{{- end -}}
{{- /* The embedded store counts in each pod's memory: every replica would grant
a principal the whole budget. */ -}}
{{- if and .Values.embedded.enabled (gt (int .Values.replicas) 1) -}}
{{- fail (printf "embedded.enabled counts in each replica's memory: with replicas %v a principal gets %v times its budget; set replicas=1 (and podDisruptionBudget.enabled=false), or use Valkey" .Values.replicas .Values.replicas) -}}
{{- end -}}
{{- /* A PodDisruptionBudget that allows no eviction blocks every node drain
(cluster upgrades included) until someone deletes it. */ -}}
{{- with .Values.podDisruptionBudget -}}
{{- if and .enabled (not (kindIs "string" .minAvailable)) (ge (int .minAvailable) (int $.Values.replicas)) -}}
{{- fail (printf "podDisruptionBudget.minAvailable (%v) must be below replicas (%v): otherwise no pod may ever be evicted and node drains block; lower it, add replicas or set podDisruptionBudget.enabled=false" .minAvailable $.Values.replicas) -}}
{{- end -}}
{{- end -}}
{{- /* After SHUTDOWN_DELAY the stop takes up to about 20 s (drain 5 s, HTTP
shutdown 1 s, ledger flush 5 s, threshold events 3 s, Valkey's close about
3.5 s, the engine's last flush): a shorter grace period SIGKILLs the pod
mid-stop and loses what it had buffered. */ -}}
{{- if lt (int .Values.terminationGracePeriodSeconds) (add (int .Values.shutdownDelaySeconds) 20) -}}
{{- fail (printf "terminationGracePeriodSeconds (%v) must be at least shutdownDelaySeconds (%v) + 20: the stop after the delay (drain, ledger flush, Valkey's last replay) takes up to about 20 s" .Values.terminationGracePeriodSeconds .Values.shutdownDelaySeconds) -}}
{{- end -}}
{{- /* A listen host on loopback (127.0.0.0/8, ::1, localhost) is reached from
inside the pod only: the kubelet's probes dial the HTTP port (HOST) on the
pod's address, so the pod would never be ready, and Envoy dials the gRPC port
(GRPC_HOST) through the Service, so every check would fail. DEBUG_HOST is not
checked: no probe uses it, and the service's own default is loopback on
purpose. */ -}}
{{- range $k, $why := dict "HOST" "the kubelet's probes dial the HTTP port on the pod's address, so the pod would never be ready" "GRPC_HOST" "Envoy dials the gRPC port through the Service, on the pod's address, so every rate limit check would fail" -}}
{{- $v := get $.Values.env $k | toString -}}
{{- $h := $v | lower | trimPrefix "[" | trimSuffix "]" -}}
{{- if or (eq $h "localhost") (regexMatch "^(::ffff:)?127\\.[0-9]+\\.[0-9]+\\.[0-9]+$" $h) (regexMatch "^[0:]*:[0:]*1$" $h) -}}
{{- fail (printf "env.%s is %s, a loopback address: %s; leave env.%s unset (0.0.0.0, every address)" $k $v $why $k) -}}
{{- end -}}
{{- end -}}
{{- /* The service refuses to start without a valid budget map at BUDGET_MAP_PATH
(internal/ratelimit/service/budgets.go startBudgetMap), and Envoy Gateway's own
rate limit Deployment mounts the same ConfigMap: an empty one would stop both. */ -}}
{{- if .Values.config.create -}}
{{- $bm := fromYaml (.Values.config.budgetMap | default "") -}}
{{- if ne (get $bm "kind" | toString) "BudgetMap" -}}
{{- fail "config.budgetMap must hold the budget map (budgetgen render --budget-map FILE; helm --set-file config.budgetMap=FILE): without one the service and Envoy Gateway's rate limit Deployment, which mounts the same ConfigMap, do not start. Or set config.create=false when the ConfigMaps are made elsewhere" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* Scheme of the HTTP port: with client certificates required on gRPC and
env.HTTP_JSON true, the service serves the HTTP port over TLS, /json asking for
the client certificate and /healthcheck open to probes that present none
(jsonExposure in internal/ratelimit/service/service.go). */ -}}
{{- define "rls.httpScheme" -}}
{{- if and (eq .Values.tls.mode "mutual") (eq (lower (toString (get .Values.env "HTTP_JSON"))) "true") -}}
HTTPS
{{- else -}}
HTTP
{{- end -}}
{{- end -}}


{{- /* The embedded store's snapshot, on the volume "state" (_pod.tpl). */ -}}
{{- define "rls.snapshotPath" -}}
/var/lib/budgetgen/ratelimit-memory.snapshot
{{- end -}}

{{- /* The claim of the embedded store's snapshot volume. */ -}}
{{- define "rls.stateClaim" -}}
{{- .Values.embedded.persistence.existingClaim | default (printf "%s-state" (include "rls.fullname" .)) -}}
{{- end -}}
