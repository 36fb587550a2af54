package toolsource

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
)

// Config is a tools config in the format MCP clients share:
//
//	{"mcpServers": {"<server>": {"command": "...", "args": [...], "env": {...}}
//	                "<server>": {"url": "https://...", "headers": {...}}}}
type Config struct {
	MCPServers map[string]ServerConfig `json:"mcpServers"`
}

// ServerConfig is one MCP server: stdio (Command) or Streamable HTTP (URL).
type ServerConfig struct {
	// Type is "stdio" or "http"; optional, it must agree with the fields.
	Type    string            `json:"type,omitempty"`
	Command string            `json:"command,omitempty"`
	Args    []string          `json:"args,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	URL     string            `json:"url,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`

	// expanded are the values ${VAR} references took: they may be
	// secrets, so they are cut out of every error and log line.
	expanded []string
}

// Redact replaces in s every value the config took from the environment.
func (s ServerConfig) Redact(text string) string {
	for _, v := range s.expanded {
		if len(v) >= 4 {
			text = strings.ReplaceAll(text, v, "REDACTED")
		}
	}
	return text
}

// Stdio reports whether the server is started as a subprocess.
func (s ServerConfig) Stdio() bool { return s.Command != "" }

// ConfigError is a tools config the worker refuses.
type ConfigError struct{ Problems []string }

func (e *ConfigError) Error() string {
	return "tools config: " + strings.Join(e.Problems, "; ")
}

var (
	serverNameRE = regexp.MustCompile(`^[A-Za-z0-9-]+$`)
	toolNameRE   = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	envRefRE     = regexp.MustCompile(`\$\{([^}]*)\}`)
	envNameRE    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// Separator joins a source's namespace and a tool's own name.
const Separator = "__"

// CheckNamespace says why a server or service name cannot prefix tool names.
func CheckNamespace(name string) error {
	if len(name) > 61 {
		// A tool name is at most 64 bytes: no tool could have this prefix.
		return fmt.Errorf("name %q cannot prefix tool names: it is longer than 61 bytes", clip(name, 64))
	}
	if !serverNameRE.MatchString(name) || strings.Contains(name, Separator) {
		return fmt.Errorf("name %q cannot prefix tool names: use letters, digits and '-'", clip(name, 64))
	}
	return nil
}

// ValidToolName reports whether a full tool name is one every model API takes.
func ValidToolName(name string) bool { return toolNameRE.MatchString(name) }

// ParseConfig decodes and checks a tools config, expanding ${VAR}
// references with getenv (ok false: unset). Every problem is reported at
// once; no value is ever quoted in an error, so secrets stay out of logs.
func ParseConfig(data []byte, getenv func(string) (string, bool)) (*Config, error) {
	var raw struct {
		MCPServers map[string]json.RawMessage `json:"mcpServers"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return nil, &ConfigError{Problems: []string{jsonProblem(err)}}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, &ConfigError{Problems: []string{"trailing data after the JSON object"}}
	}
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	cfg := &Config{MCPServers: map[string]ServerConfig{}}
	names := make([]string, 0, len(raw.MCPServers))
	for n := range raw.MCPServers {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, name := range names {
		where := fmt.Sprintf("mcpServers.%s", clip(name, 64))
		if err := CheckNamespace(name); err != nil {
			add("%s: server %v", where, err)
			continue
		}
		var s ServerConfig
		d := json.NewDecoder(bytes.NewReader(raw.MCPServers[name]))
		d.DisallowUnknownFields()
		if err := d.Decode(&s); err != nil {
			add("%s: %s", where, jsonProblem(err))
			continue
		}
		switch {
		case s.Type == "sse":
			add(`%s: "type": "sse" (the legacy HTTP+SSE transport) is not supported; use a Streamable HTTP "url" ("type": "http")`, where)
			continue
		case s.Type != "" && s.Type != "stdio" && s.Type != "http":
			add(`%s: "type" %q is not "stdio" or "http"`, where, clip(s.Type, 20))
			continue
		case s.Command != "" && s.URL != "":
			add(`%s: both "command" and "url": a server is either stdio (command) or HTTP (url)`, where)
			continue
		case s.Command == "" && s.URL == "":
			add(`%s: neither "command" nor "url"`, where)
			continue
		case s.Type == "stdio" && s.URL != "":
			add(`%s: "type": "stdio" with a "url"; stdio servers have a "command"`, where)
			continue
		case s.Type == "http" && s.Command != "":
			add(`%s: "type": "http" with a "command"; HTTP servers have a "url"`, where)
			continue
		case s.URL == "" && len(s.Headers) > 0:
			add(`%s: "headers" are for HTTP servers ("url")`, where)
			continue
		case s.Command == "" && (len(s.Args) > 0 || len(s.Env) > 0):
			add(`%s: "args" and "env" are for stdio servers ("command")`, where)
			continue
		}
		expand := func(field, v string) string {
			return envRefRE.ReplaceAllStringFunc(v, func(ref string) string {
				key := ref[2 : len(ref)-1]
				if !envNameRE.MatchString(key) {
					add("%s.%s: %q is not a variable reference like ${NAME}", where, field, clip(ref, 40))
					return ""
				}
				val, ok := getenv(key)
				if !ok {
					add("%s.%s: environment variable %s is not set", where, field, key)
				}
				if val != "" {
					s.expanded = append(s.expanded, val)
				}
				return val
			})
		}
		s.Command = expand("command", s.Command)
		for i := range s.Args {
			s.Args[i] = expand(fmt.Sprintf("args[%d]", i), s.Args[i])
		}
		for k, v := range s.Env {
			if !envNameRE.MatchString(k) {
				add("%s.env: %q is not a variable name", where, clip(k, 40))
			}
			s.Env[k] = expand("env."+k, v)
		}
		s.URL = expand("url", s.URL)
		for k, v := range s.Headers {
			s.Headers[k] = expand("headers."+k, v)
		}
		if s.URL != "" && !strings.HasPrefix(s.URL, "http://") && !strings.HasPrefix(s.URL, "https://") {
			add(`%s.url: not an http:// or https:// URL`, where)
		}
		cfg.MCPServers[name] = s
	}
	if len(problems) > 0 {
		return nil, &ConfigError{Problems: problems}
	}
	return cfg, nil
}

func jsonProblem(err error) string {
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		return "unknown key " + rest
	}
	return msg
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}
