-- Argo CD resource health for specfleet.io/InferenceService.
-- `kubectl kustomize manifests/argocd` renders the argocd-cm entry that installs it.
-- Degraded: the operator says so, the fleet misses its SLO, or the SLO error budget burns fast
-- (the SLOAtRisk condition).
local hs = {status = "Progressing", message = "Waiting for the operator"}
if obj.status == nil then
  return hs
end
if obj.status.observedGeneration ~= nil and obj.metadata.generation ~= nil
    and obj.status.observedGeneration < obj.metadata.generation then
  hs.message = "The operator has not yet observed the latest spec"
  return hs
end
local conditions = {}
if obj.status.conditions ~= nil then
  for _, c in ipairs(obj.status.conditions) do
    conditions[c.type] = c
  end
end
local degraded = conditions["Degraded"]
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = (degraded.reason or "Degraded") .. ": " .. (degraded.message or "")
  return hs
end
local atRisk = conditions["SLOAtRisk"]
if atRisk ~= nil and atRisk.status == "True" then
  hs.status = "Degraded"
  hs.message = "SLO error budget burning fast: " .. (atRisk.message or "")
  return hs
end
local ready = conditions["Ready"]
if ready ~= nil and ready.status == "True" then
  local slo = conditions["SLOMet"]
  if slo ~= nil and slo.status == "False" then
    hs.status = "Degraded"
    hs.message = "SLO missed: " .. (slo.message or "")
    return hs
  end
  hs.status = "Healthy"
  hs.message = ready.message or "Ready"
  return hs
end
if ready ~= nil then
  hs.message = ready.message or hs.message
end
return hs
