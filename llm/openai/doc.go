// Package openai is the fleet's provider for OpenAI-compatible chat
// completions servers: OpenAI and Azure OpenAI, and the servers people run
// themselves or rent (vLLM, Ollama, llama.cpp, LM Studio, DeepSeek,
// OpenRouter, Groq, Mistral, xAI, ...). Provider.Stream is an agent.StreamFn
// that follows pi's openai-completions provider.
//
// # What comes from go-openai, and what does not
//
// github.com/sashabaranov/go-openai (the version go.mod requires) is used
// for what it does well:
//
//   - Request types: messages, content parts, tool calls, tool declarations
//     and the request itself are go-openai's ChatCompletionMessage, Tool,
//     FunctionDefinition and ChatCompletionRequest, marshalled by go-openai.
//   - Client configuration: a go-openai Client is built per call from
//     ClientConfig (base URL, key, organisation, Azure deployment URLs,
//     api-version and api-key header) and sends the request through
//     CreateChatCompletionStream, so URLs and auth headers are its own.
//   - Error types: a failed response becomes go-openai's *APIError or
//     *RequestError, and provider error objects in the stream are decoded
//     with APIError's lenient decoder. FinishReason constants are its own.
//
// It is not used where it loses information real servers send, or refuses
// what they accept:
//
//   - The body is read by our own tolerant SSE decoder (sse.go) and chunk
//     assembler (chunk.go), never by go-openai's stream reader, which drops
//     delta.reasoning, fails on typed content arrays, never returns the body
//     of an `event: error`, reports a clean [DONE] and a cut connection both
//     as io.EOF, and fails after 300 keep-alive lines. The HTTP response is
//     taken from the HTTPDoer (doer in transport.go) that go-openai calls;
//     its ChatCompletionStream is only closed.
//   - The HTTPDoer replaces the body go-openai marshalled with ours, which
//     adds what go-openai omits or refuses: temperature 0, max_tokens for
//     model names its validator rejects, reasoning_effort, reasoning sent
//     back in the field it came from (reasoning, reasoning_text,
//     reasoning_details besides reasoning_content), prompt_cache_key.
//     go-openai itself is given only the model name, so its per-model
//     validators cannot refuse a request a server would accept. (It still
//     refuses the legacy completion-only names such as text-davinci-003.)
//   - Retries (go-openai has none) are done in the HTTPDoer with
//     github.com/cenkalti/backoff/v5, honouring retry-after-ms and
//     Retry-After, before any output streams; an idle watchdog bounds both
//     the wait for headers and the gaps between body bytes. Config.Gate is
//     asked before each attempt and Config.OnRetryAfter told of each rate
//     limit answer, so that a fleet can share one limit per model.
//   - Azure deployment names are checked before go-openai pastes them into
//     the URL path (it does not escape them), and go-openai's marshalled
//     messages lose their HTML escapes (\u003c for "<"), which the model
//     should not see.
//
// Streamed tool-call arguments are parsed again only every few KB (then
// every 1/16 of their length), so a long call costs linear work, and are
// capped per call by Config.MaxToolArgumentBytes.
//
// The API key is only handed to go-openai's ClientConfig (whose String
// hides it); Config and Provider print without it, and error texts are
// scrubbed of it. Nothing in this package logs.
package openai
