package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	goopenai "github.com/sashabaranov/go-openai"
)

// Identity of the messages this provider produces.
const (
	API             = "openai-completions"
	DefaultProvider = "openai"
	DefaultBaseURL  = "https://api.openai.com/v1"
)

// Defaults of the zero Config.
const (
	DefaultMaxRetries     = 3
	DefaultMaxRetryDelay  = 60 * time.Second
	DefaultIdleTimeout    = 10 * time.Minute
	DefaultRetryBaseDelay = 500 * time.Millisecond

	DefaultMaxToolArgumentBytes = 1 << 20
)

// Config configures a Provider. The zero value talks to api.openai.com
// without a key.
type Config struct {
	// BaseURL is the API root, "/chat/completions" is appended. Default
	// https://api.openai.com/v1.
	BaseURL string
	// APIKey is sent as a bearer token (as api-key for Azure). It may be empty
	// for local servers; StreamOptions.APIKey overrides it per call. It never
	// appears in errors, events or logs.
	APIKey string
	// Headers are added to every request; they win over the defaults.
	Headers map[string]string
	// Models is the model table; Model(id) and the cost of usage come from it.
	Models []ModelInfo

	// MaxRetries is how often a failed request is retried before any output
	// streamed. 0 means DefaultMaxRetries, negative means never.
	MaxRetries int
	// MaxRetryDelay is the longest wait a server may ask for with
	// Retry-After; a longer one fails at once. 0 means 60s, negative means
	// no limit.
	MaxRetryDelay time.Duration
	// RetryBaseDelay is the first backoff delay when the server gives none
	// (doubling up to 8s, with jitter). 0 means 500ms.
	RetryBaseDelay time.Duration
	// OnRetry, when set, is told about each retry before its wait: the
	// attempt that failed (1 is the first), the wait, and why (key removed).
	// It runs on the stream's goroutine and must not block.
	OnRetry func(attempt int, wait time.Duration, reason string)
	// OnRetryAfter, when set, is told when the server asks to slow down: a
	// 429, or a 503 with Retry-After or retry-after-ms. until is the time
	// the server names, or zero when a 429 names none. It is told whether
	// or not the call is retried, so that callers sharing a rate limit can
	// all pause. It runs on the stream's goroutine and must not block.
	OnRetryAfter func(model string, until time.Time)
	// Gate, when set, is asked before each HTTP attempt, retries included,
	// and may wait (for a shared rate limit, say). Its error ends the stream
	// as an error, or as aborted when ctx is done. The idle timeout does not
	// run while it waits.
	Gate func(ctx context.Context, model string) error
	// IdleTimeout ends a request that receives nothing (no headers, no bytes)
	// for this long. 0 means 10 minutes, negative means never.
	IdleTimeout time.Duration
	// MaxToolArgumentBytes bounds the streamed arguments of one tool call;
	// a model that sends more ends the stream with an error naming the
	// limit. 0 means 1 MiB, negative means no limit.
	MaxToolArgumentBytes int

	// HTTPClient sends the requests; nil uses a client of the provider's own.
	// Do not set a Timeout on it: it would cap long generations; ctx and
	// IdleTimeout bound them instead.
	HTTPClient *http.Client

	// Provider names the provider in messages; default "openai".
	Provider string
	// OrgID is sent as OpenAI-Organization.
	OrgID string
	// AzureAPIVersion, when set, talks to Azure OpenAI: deployment URLs,
	// api-version and the api-key header, as go-openai builds them.
	AzureAPIVersion string
	// PromptCacheKey sends StreamOptions.SessionID as prompt_cache_key. nil
	// sends it only to api.openai.com, which documents it.
	PromptCacheKey *bool
}

// String keeps the key out of logs and %v.
func (c Config) String() string {
	return fmt.Sprintf("openai.Config{BaseURL:%q, APIKey:%s, Models:%d}", c.BaseURL, redactedMark(c.APIKey), len(c.Models))
}

// LogValue keeps the key out of slog output.
func (c Config) LogValue() slog.Value { return slog.StringValue(c.String()) }

func redactedMark(key string) string {
	if key == "" {
		return `""`
	}
	return "[REDACTED]"
}

// ModelInfo is one entry of the model table, in pi's model JSON shape.
type ModelInfo struct {
	ID            string          `json:"id"`
	Name          string          `json:"name,omitempty"`
	ContextWindow int             `json:"contextWindow,omitempty"`
	MaxTokens     int             `json:"maxTokens,omitempty"`
	Cost          agent.ModelCost `json:"cost"` // dollars per million tokens
	Reasoning     bool            `json:"reasoning,omitempty"`
	// Input lists "text" and "image"; images are replaced by a placeholder
	// for a model without "image". Default ["text"].
	Input []string `json:"input,omitempty"`

	// ThinkingLevelMap maps a thinking level to the effort sent; a level
	// mapped to "" sends none. Unmapped levels are sent as is, except xhigh
	// and max, which become "high".
	ThinkingLevelMap map[string]string `json:"thinkingLevelMap,omitempty"`
	// ThinkingFormat says how the effort is sent: "openai" (reasoning_effort,
	// default), "openrouter" (reasoning.effort), "chat-template"
	// (chat_template_kwargs.enable_thinking, for Qwen-style templates on
	// vLLM / SGLang) or "none".
	ThinkingFormat string `json:"thinkingFormat,omitempty"`
	// MaxTokensField is "max_completion_tokens" or "max_tokens". Default:
	// max_completion_tokens for api.openai.com (its reasoning models refuse
	// max_tokens), max_tokens elsewhere (what every compatible server knows).
	MaxTokensField string `json:"maxTokensField,omitempty"`

	// Limits are the provider's limits for this model, shared by the
	// whole fleet (the worker enforces them; this package only reports
	// 429s and asks its Gate).
	Limits *ModelLimits `json:"limits,omitempty"`
	// LimitGroup names the shared budget of Limits; entries that use one
	// key share one group. Default: the model id.
	LimitGroup string `json:"limitGroup,omitempty"`
	// Compaction are the operator's defaults for runs that compact their
	// context on this model (the worker's; this package does not read it).
	Compaction *ModelCompaction `json:"compaction,omitempty"`
}

// ModelCompaction are a model's compaction defaults in tokens; 0 takes
// pi's, scaled for the window.
type ModelCompaction struct {
	ReserveTokens    int `json:"reserveTokens,omitempty"`
	KeepRecentTokens int `json:"keepRecentTokens,omitempty"`
}

// ModelLimits are per-minute limits; 0 means none.
type ModelLimits struct {
	RPM         int `json:"rpm,omitempty"`
	TPM         int `json:"tpm,omitempty"`
	Concurrency int `json:"concurrency,omitempty"`
}

// Group is the model's limit group: LimitGroup, else its id.
func (m ModelInfo) Group() string {
	if m.LimitGroup != "" {
		return m.LimitGroup
	}
	return m.ID
}

// LoadModels reads a model table: a JSON array of ModelInfo, or an object
// with a "models" array.
func LoadModels(path string) ([]ModelInfo, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("openai: model table: %w", err)
	}
	var models []ModelInfo
	trimmed := bytes.TrimSpace(b)
	if len(trimmed) > 0 && trimmed[0] == '{' {
		var wrapped struct {
			Models []ModelInfo `json:"models"`
		}
		err = json.Unmarshal(trimmed, &wrapped)
		models = wrapped.Models
	} else {
		err = json.Unmarshal(trimmed, &models)
	}
	if err != nil {
		return nil, fmt.Errorf("openai: model table %s: %w", path, err)
	}
	if err := validateModels(models); err != nil {
		return nil, fmt.Errorf("openai: model table %s: %w", path, err)
	}
	return models, nil
}

func validateModels(models []ModelInfo) error {
	seen := map[string]bool{}
	for i, m := range models {
		switch {
		case m.ID == "":
			return fmt.Errorf("model %d has no id", i)
		case seen[m.ID]:
			return fmt.Errorf("model %q listed twice", m.ID)
		case m.ContextWindow < 0 || m.MaxTokens < 0:
			return fmt.Errorf("model %q: negative token limit", m.ID)
		case m.Cost.Input < 0 || m.Cost.Output < 0 || m.Cost.CacheRead < 0 || m.Cost.CacheWrite < 0:
			return fmt.Errorf("model %q: negative cost", m.ID)
		case m.Limits != nil && (m.Limits.RPM < 0 || m.Limits.TPM < 0 || m.Limits.Concurrency < 0):
			return fmt.Errorf("model %q: negative limit", m.ID)
		case m.Compaction != nil && (m.Compaction.ReserveTokens < 0 || m.Compaction.KeepRecentTokens < 0):
			return fmt.Errorf("model %q: negative compaction tokens", m.ID)
		}
		switch m.MaxTokensField {
		case "", "max_tokens", "max_completion_tokens":
		default:
			return fmt.Errorf("model %q: unknown maxTokensField %q", m.ID, m.MaxTokensField)
		}
		switch m.ThinkingFormat {
		case "", "openai", "openrouter", "chat-template", "none":
		default:
			return fmt.Errorf("model %q: unknown thinkingFormat %q", m.ID, m.ThinkingFormat)
		}
		seen[m.ID] = true
	}
	return nil
}

// Provider streams chat completions from one OpenAI-compatible server. It is
// safe for concurrent use and holds no state between calls beyond its
// configuration and connection pool.
type Provider struct {
	cfg      Config
	baseURL  *url.URL
	models   map[string]ModelInfo
	client   *http.Client
	isOpenAI bool // api.openai.com
}

// New checks the configuration and returns a Provider.
func New(cfg Config) (*Provider, error) {
	if cfg.BaseURL == "" {
		cfg.BaseURL = DefaultBaseURL
	}
	u, err := url.Parse(cfg.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.New("openai: BaseURL must be an absolute http(s) URL")
	}
	if err := validateModels(cfg.Models); err != nil {
		return nil, fmt.Errorf("openai: %w", err)
	}
	switch {
	case cfg.MaxRetries == 0:
		cfg.MaxRetries = DefaultMaxRetries
	case cfg.MaxRetries < 0:
		cfg.MaxRetries = 0
	}
	if cfg.MaxRetryDelay == 0 {
		cfg.MaxRetryDelay = DefaultMaxRetryDelay
	}
	if cfg.RetryBaseDelay <= 0 {
		cfg.RetryBaseDelay = DefaultRetryBaseDelay
	}
	if cfg.MaxToolArgumentBytes == 0 {
		cfg.MaxToolArgumentBytes = DefaultMaxToolArgumentBytes
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.Provider == "" {
		cfg.Provider = DefaultProvider
	}
	p := &Provider{cfg: cfg, baseURL: u, models: map[string]ModelInfo{}, client: cfg.HTTPClient,
		isOpenAI: u.Hostname() == "api.openai.com"}
	if p.client == nil {
		p.client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	for _, m := range cfg.Models {
		p.models[m.ID] = m
	}
	return p, nil
}

// String keeps the key out of logs.
func (p *Provider) String() string { return "openai.Provider(" + p.cfg.String() + ")" }

// CloseIdleConnections closes the idle connections of the provider's client.
func (p *Provider) CloseIdleConnections() { p.client.CloseIdleConnections() }

// Model returns the table entry for id as an agent.Model, or a bare model
// with that id when the table does not list it.
func (p *Provider) Model(id string) agent.Model {
	m := agent.Model{ID: id, Name: id, API: API, Provider: p.cfg.Provider, BaseURL: p.cfg.BaseURL, Input: []string{"text"}}
	if info, ok := p.models[id]; ok {
		if info.Name != "" {
			m.Name = info.Name
		}
		m.Reasoning = info.Reasoning
		if len(info.Input) > 0 {
			m.Input = append([]string(nil), info.Input...)
		}
		m.Cost = info.Cost
		m.ContextWindow = info.ContextWindow
		m.MaxTokens = info.MaxTokens
	}
	return m
}

// Models returns the ids of the model table, in its order.
func (p *Provider) Models() []string {
	out := make([]string, len(p.cfg.Models))
	for i, m := range p.cfg.Models {
		out[i] = m.ID
	}
	return out
}

// info returns the table entry for a model, or one derived from the model.
func (p *Provider) info(model agent.Model) ModelInfo {
	if info, ok := p.models[model.ID]; ok {
		return info
	}
	return ModelInfo{ID: model.ID, Reasoning: model.Reasoning, Input: model.Input, Cost: model.Cost,
		ContextWindow: model.ContextWindow, MaxTokens: model.MaxTokens}
}

// clientConfig is go-openai's client configuration for one call: it builds
// the URL (Azure deployments included) and the auth and org headers.
func (p *Provider) clientConfig(key string, doer goopenai.HTTPDoer) goopenai.ClientConfig {
	var c goopenai.ClientConfig
	if p.cfg.AzureAPIVersion != "" {
		c = goopenai.DefaultAzureConfig(key, p.cfg.BaseURL)
		c.APIVersion = p.cfg.AzureAPIVersion
		mapName := c.AzureModelMapperFunc
		// go-openai pastes the name into the path as is; checkDeployment
		// has refused unsafe names already, escaping is a second guard.
		c.AzureModelMapperFunc = func(model string) string { return url.PathEscape(mapName(model)) }
	} else {
		c = goopenai.DefaultConfig(key)
		c.BaseURL = p.cfg.BaseURL
	}
	c.OrgID = p.cfg.OrgID
	c.HTTPClient = doer
	return c
}

// maxDeploymentName bounds an Azure deployment name; Azure allows 64.
const maxDeploymentName = 255

// checkDeployment refuses a model id that, in Azure mode, would not name one
// deployment: the name goes into the URL path next to the api-key header, so
// "../" or "?" in it would send the key to another endpoint.
func (p *Provider) checkDeployment(model string) error {
	if p.cfg.AzureAPIVersion == "" {
		return nil
	}
	name := goopenai.DefaultAzureConfig("", "").GetAzureDeploymentByModel(model)
	ok := name != "" && name != "." && name != ".." && len(name) <= maxDeploymentName
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			ok = false
			break
		}
	}
	if !ok {
		return fmt.Errorf("openai: model %s is not a valid Azure deployment name (letters, digits, '-', '_' and '.')", capText(strconv.Quote(model)))
	}
	return nil
}
