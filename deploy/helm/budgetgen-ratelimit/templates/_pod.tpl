{{/*
Where the pod finds its files. The paths are part of the chart's contract: deploy/chart_test.go
starts the service with exactly these settings and files.
- /etc/budgetgen/config      the rendered rate limit configs (CONFIG_DIR; ConfigMap keys are
                             symlinks into ..data, which RUNTIME_IGNOREDOTFILES skips)
- /etc/budgetgen/budget-map  the budget map (BUDGET_MAP_PATH)
- /etc/budgetgen/tls         tls.crt, tls.key, ca.crt of the server Secret
- /etc/budgetgen/valkey      the Valkey password file (auth), when valkey.authKey is set, and
                             the sentinels' (sentinel-auth), when valkey.sentinelAuthKey is
- /etc/budgetgen/valkey-ca   ca.crt, the CA of Valkey's certificate, when valkey.caCert names one
- /etc/budgetgen/valkey-client  tls.crt, tls.key, the client certificate Valkey may require,
                             when valkey.clientCert names its Secret
- /var/lib/budgetgen         the embedded store's snapshot (MEMORY_SNAPSHOT_PATH), with
                             embedded.enabled: the one writable volume (the image's
                             XDG_STATE_HOME=/var/lib, on the read-only root filesystem otherwise)
*/}}
{{- define "rls.env" -}}
- name: CONFIG_TYPE
  value: FILE
- name: CONFIG_DIR
  value: /etc/budgetgen/config
- name: RUNTIME_IGNOREDOTFILES
  value: "true"
- name: BUDGET_MAP_PATH
  value: /etc/budgetgen/budget-map/budget-map.yaml
{{- if .Values.embedded.enabled }}
- name: MEMORY_SNAPSHOT_PATH
  value: {{ include "rls.snapshotPath" . }}
{{- else }}
- name: REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.valkey.secretName }}
      key: {{ .Values.valkey.urlKey }}
- name: REDIS_TYPE
  value: {{ .Values.valkey.type | quote }}
{{- if .Values.valkey.authKey }}
- name: REDIS_AUTH_FILE
  value: /etc/budgetgen/valkey/auth
{{- end }}
{{- if .Values.valkey.sentinelAuthKey }}
- name: REDIS_SENTINEL_AUTH_FILE
  value: /etc/budgetgen/valkey/sentinel-auth
{{- end }}
{{- if .Values.valkey.tls }}
- name: REDIS_TLS
  value: "true"
{{- end }}
{{- if include "rls.valkeyCA" . }}
- name: REDIS_TLS_CACERT
  value: /etc/budgetgen/valkey-ca/ca.crt
{{- end }}
{{- if .Values.valkey.clientCert.secretName }}
- name: REDIS_TLS_CLIENT_CERT
  value: /etc/budgetgen/valkey-client/tls.crt
- name: REDIS_TLS_CLIENT_KEY
  value: /etc/budgetgen/valkey-client/tls.key
{{- end }}
{{- end }}
- name: GRPC_PORT
  value: {{ .Values.ports.grpc | quote }}
- name: PORT
  value: {{ .Values.ports.http | quote }}
- name: USE_PROMETHEUS
  value: "true"
- name: PROMETHEUS_ADDR
  value: {{ printf ":%v" .Values.ports.metrics | quote }}
- name: LOG_FORMAT
  value: json
- name: SHUTDOWN_DELAY
  value: {{ printf "%ds" (int .Values.shutdownDelaySeconds) | quote }}
{{- if ne .Values.tls.mode "disabled" }}
- name: GRPC_SERVER_USE_TLS
  value: "true"
- name: GRPC_SERVER_TLS_CERT
  value: /etc/budgetgen/tls/tls.crt
- name: GRPC_SERVER_TLS_KEY
  value: /etc/budgetgen/tls/tls.key
{{- end }}
{{- if eq .Values.tls.mode "mutual" }}
- name: GRPC_SERVER_TLS_CA_CERT
  value: /etc/budgetgen/tls/ca.crt
{{- end }}
{{- if not (hasKey .Values.env "HTTP_JSON") }}
{{- /* /json charges budgets, and the NetworkPolicy opens the HTTP port to every
source (the kubelet's probes): off unless env.HTTP_JSON asks for it. Under
tls.mode mutual the service's own default (auto) is off too; under server or
disabled it would be on (docs/security.md, "The HTTP port is no way around mTLS"). */}}
- name: HTTP_JSON
  value: "false"
{{- end }}
{{- /* Helm reads a values file's numbers as float64, which quote prints as
1.34217728e+08 from eight digits on: the service refuses that for an integer
setting (VALKEY_BUFFER_MAX_BYTES), so whole numbers are printed as integers. */}}
{{- range $k, $v := .Values.env }}
- name: {{ $k }}
  {{- if and (kindIs "float64" $v) (eq (floor $v) $v) }}
  value: {{ $v | int64 | quote }}
  {{- else }}
  value: {{ $v | quote }}
  {{- end }}
{{- end }}
{{- end -}}

{{- define "rls.mounts" -}}
- name: config
  mountPath: /etc/budgetgen/config
  readOnly: true
- name: budget-map
  mountPath: /etc/budgetgen/budget-map
  readOnly: true
{{- if ne .Values.tls.mode "disabled" }}
- name: tls
  mountPath: /etc/budgetgen/tls
  readOnly: true
{{- end }}
{{- if .Values.embedded.enabled }}
- name: state
  mountPath: {{ dir (include "rls.snapshotPath" .) }}
{{- else }}
{{- if or .Values.valkey.authKey .Values.valkey.sentinelAuthKey }}
- name: valkey
  mountPath: /etc/budgetgen/valkey
  readOnly: true
{{- end }}
{{- if include "rls.valkeyCA" . }}
- name: valkey-ca
  mountPath: /etc/budgetgen/valkey-ca
  readOnly: true
{{- end }}
{{- if .Values.valkey.clientCert.secretName }}
- name: valkey-client
  mountPath: /etc/budgetgen/valkey-client
  readOnly: true
{{- end }}
{{- end }}
{{- end -}}

{{- define "rls.volumes" -}}
- name: config
  configMap:
    name: {{ .Values.config.name }}
- name: budget-map
  configMap:
    name: {{ .Values.config.budgetMapName }}
{{- if ne .Values.tls.mode "disabled" }}
- name: tls
  secret:
    secretName: {{ include "rls.serverSecret" . }}
{{- end }}
{{- if .Values.embedded.enabled }}
- name: state
  {{- if .Values.embedded.persistence.enabled }}
  persistentVolumeClaim:
    claimName: {{ include "rls.stateClaim" . }}
  {{- else }}
  emptyDir: {}
  {{- end }}
{{- else }}
{{- if or .Values.valkey.authKey .Values.valkey.sentinelAuthKey }}
- name: valkey
  secret:
    secretName: {{ .Values.valkey.secretName }}
    items:
      {{- with .Values.valkey.authKey }}
      - key: {{ . }}
        path: auth
      {{- end }}
      {{- with .Values.valkey.sentinelAuthKey }}
      - key: {{ . }}
        path: sentinel-auth
      {{- end }}
{{- end }}
{{- with .Values.valkey.caCert }}
{{- if .secretName }}
- name: valkey-ca
  secret:
    secretName: {{ .secretName }}
    items:
      - key: {{ .key | default "ca.crt" }}
        path: ca.crt
{{- else if .configMapName }}
- name: valkey-ca
  configMap:
    name: {{ .configMapName }}
    items:
      - key: {{ .key | default "ca.crt" }}
        path: ca.crt
{{- end }}
{{- end }}
{{- with .Values.valkey.clientCert.secretName }}
- name: valkey-client
  secret:
    secretName: {{ . }}
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
{{- end }}
{{- end }}
{{- end -}}
