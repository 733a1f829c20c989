{%- set c = cookiecutter -%}
{%- set mod = c.project_slug.split("_")|map("capitalize")|join -%}
{%- set job = c.job_type.split("_")|map("capitalize")|join ~ "Job" -%}
# frozen_string_literal: true

require "fileutils"
require "securerandom"

# How the suite steers a run of the job from outside: stop it at a crash point (before or after the effect,
# before the completion) to be killed or paused there, hold two runs at a barrier right before they claim, or two
# runs in two processes right before they apply the stale-claim policy, and note when a run has finished.
# Instructions are files in one directory, so a live worker process reads what the spec wrote. Only the suite
# loads this.
module ReplayPoints
  BARRIER_TIMEOUT = 10
  # How long a paused run waits to be resumed before it fails.
  PAUSE_TIMEOUT = 20

  class << self
    attr_accessor :dir

    # :kill_self in an embedded forked run (it dies by SIGKILL on its own); :wait_to_be_killed in a live
    # worker (the spec sends the kill -9).
    attr_accessor :on_crash
  end

  module_function

  def crash_at(key, point)
    File.write(path("crash", key), point.to_s)
  end

  # The key's effect raises, as a provider that is down would, until clear: in this process or a live worker.
  def fail_effect(key)
    put(path("fail", key), "")
  end

  # The two runs of the key wait for each other right before they claim.
  def hold_at_barrier(key)
    put(path("barrier", key), SecureRandom.uuid)
  end

  # A run of the key in the process `pid` waits at the point until resume(key, point): the spec acts meanwhile
  # (stops the database, or the whole process with SIGSTOP). Once: the first run to get there takes it.
  def halt_at(key, point, pid)
    put(path("halt", key), [point, pid].join(" "))
  end

  def resume(key, point)
    put(path("resume-#{point}", key), "")
  end

  # The runs of the key that reach the stale-claim policy, in this process or another, wait there for each
  # other: the sweeper and a redelivery meeting the same stale claim at the same moment.
  def meet_at_policy(key)
    put(path("meet", key), SecureRandom.uuid)
  end

  # How many runs of the key reached the barrier ("barrier") or the policy ("meet") while the instruction held.
  def arrivals(key, kind = "meet")
    Dir.glob("#{path("arrived-#{kind}", key)}-*").size
  end

  def clear
    instructions = File.join(dir, "{crash,barrier,reached,halt,resume,meet,arrived,fail}-*")
    Dir.glob(instructions).each { |file| FileUtils.rm_f(file) }
  end

  # Whether a run of the key reached a crash or halt point (that point, when given).
  def reached?(key, point = nil)
    at = File.read(path("reached", key))
    point.nil? || at == point.to_s
  rescue Errno::ENOENT
    false
  end

  def finish(jid, outcome)
    put(File.join(dir, "done-#{jid}"), outcome)
  end

  def forget(jid)
    FileUtils.rm_f(File.join(dir, "done-#{jid}"))
  end

  # "returned" or "raised" once the job with this jid has finished, else nil.
  def outcome(jid)
    File.read(File.join(dir, "done-#{jid}"))
  rescue Errno::ENOENT
    nil
  end

  def crash_point(point, key)
    halt_point(point, key)
    crash = path("crash", key)
    return unless File.exist?(crash) && File.read(crash) == point.to_s

    put(path("reached", key), point.to_s)
    Process.kill(:KILL, Process.pid) if on_crash == :kill_self
    sleep # until the spec's kill -9 arrives
  end

  def halt_point(point, key)
    at, pid = File.read(path("halt", key)).split
    return unless at == point.to_s && pid.to_i == Process.pid && take(path("halt", key))

    put(path("reached", key), point.to_s)
    wait_until("#{key}: never resumed at #{point}", PAUSE_TIMEOUT) { File.exist?(path("resume-#{point}", key)) }
  rescue Errno::ENOENT
    nil # no instruction for this key
  end

  # While the instruction `kind` ("barrier" or "meet") holds for the key, every run that gets here waits until
  # two have arrived, in whatever threads or processes, so that both go on at the same moment.
  def barrier(key, kind = "barrier")
    meeting = "#{path("arrived-#{kind}", key)}-#{File.read(path(kind, key))}"
    File.write("#{meeting}-#{Process.pid}-#{Thread.current.object_id}", "")
    wait_until("#{key}: the second run never reached the #{kind}", BARRIER_TIMEOUT) do
      Dir.glob("#{meeting}-*").size >= 2
    end
  rescue Errno::ENOENT
    nil # no instruction for this key
  end

  def path(kind, key)
    File.join(dir, "#{kind}-#{key.unpack1('H*')}")
  end

  # Written aside and renamed into place: a reader sees all of it or nothing.
  def put(file, content)
    File.write("#{file}.#{Process.pid}.tmp", content)
    File.rename("#{file}.#{Process.pid}.tmp", file)
  end

  # True for the one caller that moves the instruction out of the way.
  def take(file)
    File.rename(file, "#{file}.taken.#{Process.pid}.#{Thread.current.object_id}")
    true
  rescue Errno::ENOENT
    false
  end

  def wait_until(failure, seconds)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
    until yield
      raise failure if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.002
    end
  end

  # Prepended to the job: the seams where a run is held or stopped.
  module JobSeams
    private

    def claim_operation(key, details)
      ReplayPoints.barrier(key)
      super
    end

    def perform_effect(claim, details)
      ReplayPoints.crash_point(:before_effect, claim.key)
      super.tap { ReplayPoints.crash_point(:after_effect, claim.key) }
    end

    def complete_operation(claim)
      ReplayPoints.crash_point(:before_completion, claim.key)
      super
    end
  end

  # Prepended to the effect: the seam where it fails.
  module EffectSeams
    def perform(key, details)
      raise IOError, "the provider refused #{key} (a replay point)" if File.exist?(ReplayPoints.path("fail", key))

      super
    end
  end

  # Prepended to the claims: the seam where a run applies the stale-claim policy.
  module ClaimSeams
    def apply_policy(key, token)
      ReplayPoints.barrier(key, "meet")
      super
    end
  end

  {{ mod }}::{{ job }}.prepend(JobSeams)
  {{ mod }}::Claims.prepend(ClaimSeams)
  {{ mod }}::Effect.singleton_class.prepend(EffectSeams)
end
