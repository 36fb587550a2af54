package worker

// For the package's external tests (package worker_test).

// CallInputTokens is callInputTokens: the spending tests price a call as
// the worker does.
var CallInputTokens = callInputTokens

// EstimateTokens is estimateTokens: a call's rate-limit reservation.
var EstimateTokens = estimateTokens
