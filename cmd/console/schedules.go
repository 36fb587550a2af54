package main

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/agentfleet/agentfleet/bus"
)

// The Schedules page (protocol 1.10, docs/protocol.md §2 Schedules): the
// schedules with their next fire and last run; with --allow-control,
// pause, resume and trigger. Creating one stays with `submit schedule
// create` and the wire (a request written in full).

// scheduleRow is one schedule as the page shows it.
type scheduleRow struct {
	bus.ScheduleInfo
	Spec string `json:"spec"`
	// LastState is the last run's state ("" without one, "?" unread).
	LastState string `json:"lastState,omitempty"`
}

func (s *server) listSchedules(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	defer cancel()
	list, err := s.client.ListSchedules(ctx)
	if err != nil {
		writeError(w, http.StatusBadGateway, "%v", err)
		return
	}
	rows := make([]scheduleRow, 0, len(list))
	for _, info := range list {
		row := scheduleRow{ScheduleInfo: info, Spec: info.Pattern()}
		if info.TimeZone != "" {
			row.Spec += " (" + info.TimeZone + ")"
		}
		if info.Last != nil {
			row.LastState = "?"
			if rec, err := s.client.Status(ctx, info.Last.Run); err == nil {
				row.LastState = rec.State
			}
		}
		rows = append(rows, row)
	}
	writeJSON(w, http.StatusOK, map[string]any{"schedules": rows})
}

// scheduleAction pauses, resumes or triggers a schedule.
func (s *server) scheduleAction(w http.ResponseWriter, r *http.Request) {
	name, action := r.PathValue("name"), r.PathValue("action")
	if !bus.ValidID(name) {
		writeError(w, http.StatusBadRequest, "invalid schedule name %q", name)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	var err error
	out := map[string]any{"name": name, "action": action}
	switch action {
	case "pause":
		err = s.client.PauseSchedule(ctx, name)
	case "resume":
		err = s.client.ResumeSchedule(ctx, name)
	case "trigger":
		var id string
		id, err = s.client.TriggerSchedule(ctx, name)
		out["run"] = id
	default:
		writeError(w, http.StatusNotFound, "unknown action %q: use pause, resume or trigger", action)
		return
	}
	switch {
	case errors.Is(err, bus.ErrScheduleNotFound):
		writeError(w, http.StatusNotFound, "%v", err)
		return
	case err != nil:
		writeError(w, http.StatusBadGateway, "%v", err)
		return
	}
	s.log.Info("schedule "+action, "schedule", name, "user", userOf(r))
	writeJSON(w, http.StatusOK, out)
}
