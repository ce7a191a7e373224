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
local function degraded(prefix, c)
  return {status = "Degraded", message = prefix .. (c.message or "")}
end
local failed = conditions["Degraded"]
if failed ~= nil and failed.status == "True" then
  return degraded((failed.reason or "Degraded") .. ": ", failed)
end
local atRisk = conditions["SLOAtRisk"]
if atRisk ~= nil and atRisk.status == "True" then
  return degraded("SLO error budget burning fast: ", atRisk)
end
local ready = conditions["Ready"]
if ready ~= nil and ready.status == "True" then
  local slo = conditions["SLOMet"]
  if slo ~= nil and slo.status == "False" then
    return degraded("SLO missed: ", slo)
  end
  hs.status = "Healthy"
  hs.message = ready.message or "Ready"
  return hs
end
if ready ~= nil then
  hs.message = ready.message or hs.message
end
return hs
