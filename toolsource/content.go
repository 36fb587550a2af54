package toolsource

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// mcpResult maps an MCP tool result onto the agent's: text and images
// as they are, an embedded text resource as text with its URI, a resource
// link as a line "<uri> (<name>)", anything else as a marker;
// structuredContent goes to Details (and to a JSON text block when there
// is no text). isError becomes an error carrying the text.
func mcpResult(res *mcp.CallToolResult) (agent.ToolResult, error) {
	var out agent.ToolResult
	hasText := false
	for _, c := range res.Content {
		switch c := c.(type) {
		case *mcp.TextContent:
			out.Content = append(out.Content, agent.Text(c.Text))
			hasText = true
		case *mcp.ImageContent:
			out.Content = append(out.Content, agent.Image(base64.StdEncoding.EncodeToString(c.Data), c.MIMEType))
		case *mcp.EmbeddedResource:
			if c.Resource != nil && c.Resource.Blob == nil {
				out.Content = append(out.Content, agent.Text(c.Resource.URI+"\n"+c.Resource.Text))
				hasText = true
			} else {
				uri := ""
				if c.Resource != nil {
					uri = c.Resource.URI
				}
				out.Content = append(out.Content, agent.Text(fmt.Sprintf("[unsupported resource content: binary %s]", uri)))
			}
		case *mcp.ResourceLink:
			out.Content = append(out.Content, agent.Text(fmt.Sprintf("%s (%s)", c.URI, c.Name)))
			hasText = true
		default:
			out.Content = append(out.Content, agent.Text(fmt.Sprintf("[unsupported %s content]", contentType(c))))
		}
	}
	if res.StructuredContent != nil {
		out.Details = res.StructuredContent
		if !hasText {
			if b, err := json.Marshal(res.StructuredContent); err == nil {
				out.Content = append(out.Content, agent.Text(string(b)))
			}
		}
	}
	out.Content = checkContent(out.Content)
	if res.IsError {
		return agent.ToolResult{}, errors.New(resultText(out.Content, "the tool reported an error"))
	}
	return out, nil
}

// checkContent keeps of a source's result what a tool result may hold:
// text blocks (their text only) and images with an image/<type> mimeType
// and base64 data, the checks a request's tool results get
// (bus.RunRequest.Validate). Anything else, a thinking or toolCall block
// included, becomes a marker text: a source cannot put words in the
// model's mouth or a header-breaking mimeType into a model request.
func checkContent(cs []agent.Content) []agent.Content {
	if cs == nil {
		return nil
	}
	out := make([]agent.Content, 0, len(cs))
	for _, c := range cs {
		switch c.Type {
		case agent.ContentText:
			out = append(out, agent.Text(c.Text))
		case agent.ContentImage:
			switch {
			case !bus.ValidImageMIME(c.MimeType):
				out = append(out, agent.Text(fmt.Sprintf("[unsupported image content: mimeType %q]", clip(c.MimeType, 40))))
			case c.Data == "" || !isBase64(c.Data):
				out = append(out, agent.Text("[unsupported image content: its data is not base64]"))
			default:
				out = append(out, agent.Image(c.Data, c.MimeType))
			}
		default:
			out = append(out, agent.Text(fmt.Sprintf("[unsupported %s content]", clip(c.Type, 40))))
		}
	}
	return out
}

func isBase64(s string) bool {
	_, err := base64.StdEncoding.DecodeString(s)
	return err == nil
}

func contentType(c mcp.Content) string {
	switch c.(type) {
	case *mcp.AudioContent:
		return "audio"
	case *mcp.ToolUseContent:
		return "tool_use"
	case *mcp.ToolResultContent:
		return "tool_result"
	}
	b, err := json.Marshal(c)
	if err == nil {
		var t struct{ Type string }
		if json.Unmarshal(b, &t) == nil && t.Type != "" {
			return t.Type
		}
	}
	return "unknown"
}

// resultText joins the text blocks of an error result.
func resultText(cs []agent.Content, empty string) string {
	var parts []string
	for _, c := range cs {
		if c.Type == agent.ContentText && c.Text != "" {
			parts = append(parts, c.Text)
		}
	}
	if len(parts) == 0 {
		return empty
	}
	return strings.Join(parts, "\n")
}
